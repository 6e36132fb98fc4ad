"""Diagnosis on synthetic summaries with injected anomalies: who, what, which category."""

from __future__ import annotations

import pytest

from perfdiag.analyzer.pipeline import analyze_capture
from perfdiag.analyzer.report.analysis import Analysis
from perfdiag.analyzer.report.verdict import verdict_of
from perfdiag.analyzer.signals.hardware import resource_category
from perfdiag.api.thresholds import Thresholds
from perfdiag.api.verdict import Finding
from tests.analyzer.conftest import COMM, GPU_COMM, Fault, SyntheticJob, capture_of

TOKENIZE = "train.py(57): tokenize"
LOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def run(job: SyntheticJob, **kwargs: object) -> Analysis:
    table, metas = job.build()
    return analyze_capture(capture_of(table, metas), **kwargs)  # type: ignore[arg-type]


def culprit_findings(analysis: Analysis) -> list[Finding]:
    return [
        f for f in verdict_of(analysis).findings if f.kind in ("slow_worker", "function_anomaly")
    ]


@pytest.mark.parametrize("n_ranks", [2, 4, 8])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_python_hotspot_names_rank_function_and_category(n_ranks: int, seed: int) -> None:
    job = SyntheticJob(
        n_ranks=n_ranks, seed=seed, faults=[Fault([1], TOKENIZE, "python", extra_ms=40.0)]
    )
    analysis = run(job)
    verdict = verdict_of(analysis)
    assert verdict.status == "degraded"
    top = verdict.findings[0]
    assert (top.kind, top.ranks, top.category, top.function) == (
        "slow_worker",
        [1],
        "python",
        TOKENIZE,
    )
    assert 0.25 < top.severity < 0.45  # 40 ms of a ~110 ms step
    anomalies = [f for f in verdict.findings if f.kind == "function_anomaly"]
    assert [(f.function, f.ranks, f.category) for f in anomalies] == [(TOKENIZE, [1], "python")]
    # The peers wait more in communication: they are victims, never culprits.
    for finding in verdict.findings:
        assert set(finding.ranks) <= {1}, finding
    victims = top.evidence["workers"][0]["victims"]
    assert victims["ranks"] == [r for r in range(n_ranks) if r != 1]
    assert victims["waiting_in"] == COMM
    assert "Rank 1" in verdict.summary and TOKENIZE in verdict.summary
    waits = "waits" if n_ranks == 2 else "wait"
    assert f"{waits} for it in gloo:all_reduce" in verdict.summary


def test_extra_aten_work_is_cpu_op() -> None:
    job = SyntheticJob(n_ranks=4, seed=3, faults=[Fault([3], "aten::mm", "cpu_op", extra_ms=45.0)])
    verdict = verdict_of(run(job))
    top = verdict.findings[0]
    assert (top.kind, top.ranks, top.category, top.function) == (
        "slow_worker",
        [3],
        "cpu_op",
        "aten::mm",
    )
    assert verdict.status == "degraded"


def test_extra_work_spread_over_many_ops_is_cpu_op_without_a_single_function() -> None:
    # 15% more time in every aten op: no single function dominates, the category does.
    ops = ["aten::addmm", "aten::mm", "aten::threshold_backward", "aten::relu", "aten::add_"]
    base = {
        "aten::addmm": 24.0,
        "aten::mm": 16.0,
        "aten::threshold_backward": 3.0,
        "aten::relu": 2.5,
        "aten::add_": 4.0,
    }
    faults = [Fault([2], op, "cpu_op", extra_ms=base[op] * 0.35) for op in ops]
    verdict = verdict_of(run(SyntheticJob(n_ranks=8, seed=4, faults=faults)))
    top = verdict.findings[0]
    assert (top.kind, top.ranks, top.category) == ("slow_worker", [2], "cpu_op")
    assert not [f for f in verdict.findings if f.kind == "function_anomaly"]


def test_dataloader_stall_is_dataloader() -> None:
    job = SyntheticJob(n_ranks=4, seed=5, faults=[Fault([2], LOADER, "dataloader", extra_ms=35.0)])
    verdict = verdict_of(run(job))
    top = verdict.findings[0]
    assert (top.kind, top.ranks, top.category, top.function) == (
        "slow_worker",
        [2],
        "dataloader",
        LOADER,
    )


def test_uninstrumented_work_counts_as_python_and_says_so() -> None:
    # Without Python stacks, a pure-Python hotspot runs under no profiled op: idle time.
    job = SyntheticJob(n_ranks=4, seed=6, faults=[Fault([0], "<idle>", "idle", extra_ms=40.0)])
    verdict = verdict_of(run(job))
    top = verdict.findings[0]
    assert (top.kind, top.ranks, top.category, top.function) == ("slow_worker", [0], "python", None)
    assert "Python stacks" in top.message
    assert not [f for f in verdict.findings if f.kind == "function_anomaly"]


def test_two_slow_ranks_with_the_same_cause_fuse_into_one_finding() -> None:
    job = SyntheticJob(n_ranks=8, seed=7, faults=[Fault([2, 5], TOKENIZE, "python", 30.0)])
    verdict = verdict_of(run(job))
    slow = [f for f in verdict.findings if f.kind == "slow_worker"]
    assert len(slow) == 1
    assert slow[0].ranks == [2, 5]
    assert {w["rank"] for w in slow[0].evidence["workers"]} == {2, 5}


def test_two_slow_ranks_with_different_causes_are_two_findings() -> None:
    job = SyntheticJob(
        n_ranks=8,
        seed=8,
        faults=[Fault([2], TOKENIZE, "python", 50.0), Fault([6], LOADER, "dataloader", 25.0)],
    )
    verdict = verdict_of(run(job))
    slow = [(f.ranks, f.category) for f in verdict.findings if f.kind == "slow_worker"]
    assert slow == [([2], "python"), ([6], "dataloader")]  # sorted by severity


@pytest.mark.parametrize("seed", range(5))
def test_one_step_spike_is_not_persistent_and_not_reported(seed: int) -> None:
    # Rank 2 spends 400 ms in one step only (a checkpoint, a one-off stall): 40 ms/step on
    # average, as much as the persistent hotspot above, but in 1 step of 10.
    job = SyntheticJob(
        n_ranks=4, seed=seed, faults=[Fault([2], TOKENIZE, "python", 400.0, steps=[4])]
    )
    analysis = run(job)
    assert verdict_of(analysis).status == "healthy", verdict_of(analysis).summary
    assert verdict_of(analysis).findings == []
    k = analysis.features.index_of("python", TOKENIZE)
    assert k is not None
    assert analysis.deviations.candidate[2, k]  # outlying on average …
    assert not analysis.deviations.outlying[2, k]  # … but not persistent
    assert analysis.deviations.steps_outlying[2, k] == 1


def test_healthy_jitter_across_many_seeds_and_sizes_is_healthy() -> None:
    # ±10% per (rank, step, function) and ±5% persistent per-rank speed: a flaky diagnosis
    # is a failing one, so no seed may produce a finding above the reporting threshold.
    thresholds = Thresholds()
    for n_ranks in (2, 3, 4, 8, 32):
        for seed in range(40):
            job = SyntheticJob(
                n_ranks=n_ranks, seed=1000 + seed, step_jitter=0.10, rank_jitter=0.05
            )
            verdict = verdict_of(run(job))
            assert verdict.status == "healthy", (n_ranks, seed, verdict.summary)
            assert all(f.severity < thresholds.report_severity for f in verdict.findings)
            assert verdict.findings == []
            lead = {2: "Both ranks"}.get(n_ranks, f"All {n_ranks} ranks")
            assert verdict.summary.startswith(f"{lead} look healthy")


def test_healthy_summary_states_step_time() -> None:
    verdict = verdict_of(run(SyntheticJob(n_ranks=4, seed=9)))
    assert verdict.status == "healthy"
    assert "median step" in verdict.summary
    assert set(verdict.window.step_time_ms.per_rank) == {"0", "1", "2", "3"}
    assert verdict.window.step_time_ms.max >= verdict.window.step_time_ms.median > 50


def test_job_wide_dataloader_starvation_is_expected_range_on_all_ranks() -> None:
    # Every rank waits ~30 ms per step for input: peers look alike, the range check sees it.
    job = SyntheticJob(n_ranks=4, seed=10, scale={"dataloader": 50.0})
    verdict = verdict_of(run(job))
    # A whole-job observation, shown and advised, is no fault of a part of the job.
    assert verdict.status == "healthy"
    assert not verdict.findings
    ranges = verdict.observations
    assert [(f.kind, f.category, f.ranks) for f in ranges] == [
        ("expected_range", "dataloader", [0, 1, 2, 3])
    ]
    assert ranges[0].function == LOADER
    assert "The job as a whole (advice, not a fault)" in verdict.summary
    assert '"observations"' in verdict.to_json()


@pytest.mark.parametrize("seed", range(3))
def test_one_long_pause_on_every_rank_is_not_an_expected_range_problem(seed: int) -> None:
    # A full GC of 700 ms on every rank in the first step (seen right after the profiler
    # starts): 70 ms/step on average, far over the gc bound, but in 1 step of 10.
    job = SyntheticJob(
        n_ranks=4,
        seed=seed,
        faults=[Fault([0, 1, 2, 3], "gc.collect(gen=2)", "gc", 700.0, steps=[0])],
    )
    verdict = verdict_of(run(job))
    assert not verdict.observations, verdict.summary
    # The same pause in every step is the job's shape and is reported.
    every_step = SyntheticJob(
        n_ranks=4, seed=seed, faults=[Fault([0, 1, 2, 3], "gc.collect(gen=2)", "gc", 70.0)]
    )
    ranges = verdict_of(run(every_step)).observations
    assert [(f.category, f.ranks) for f in ranges] == [("gc", [0, 1, 2, 3])]


def test_gpu_job_uses_gpu_ranges() -> None:
    job = SyntheticJob(n_ranks=4, seed=11, gpu=True, scale={"cuda_runtime": 20.0})
    verdict = verdict_of(run(job))
    ranges = {f.category: f for f in verdict.observations}
    assert verdict.status == "healthy"
    assert set(ranges) == {"cuda_runtime"}  # 10 ms of ~100 ms: 9% over the 1% GPU bound
    assert ranges["cuda_runtime"].evidence["job_kind"] == "gpu"


def test_victims_waiting_is_not_an_expected_range_problem() -> None:
    # A big straggler makes its peers wait ~60% of the step in communication; that time is
    # the straggler's fault and must not become a job-wide communication finding.
    job = SyntheticJob(n_ranks=4, seed=12, faults=[Fault([1], TOKENIZE, "python", 150.0)])
    verdict = verdict_of(run(job))
    assert verdict.findings[0].ranks == [1]
    assert not verdict.observations
    assert not [f for f in verdict.findings if f.kind == "expected_range"]


def test_degraded_gpu_clock_is_attributed_to_hardware() -> None:
    kernel = "sm80_xmma_gemm_bf16bf16_bf16f32"
    job = SyntheticJob(
        n_ranks=8,
        seed=13,
        gpu=True,
        faults=[Fault([5], kernel, "gpu_compute", extra_ms=30.0, clock_factor=0.6)],
    )
    verdict = verdict_of(run(job))
    top = verdict.findings[0]
    assert (top.kind, top.ranks, top.category, top.function) == (
        "slow_worker",
        [5],
        "gpu_hardware",
        kernel,
    )
    hardware = [f for f in verdict.findings if f.kind == "hardware"]
    assert [(f.ranks, f.category, f.function) for f in hardware] == [([5], "gpu_hardware", kernel)]
    assert hardware[0].evidence["resource"] == "sm_clock_MHz"
    assert hardware[0].evidence["deviation"] < -0.3
    # Victims wait in NCCL.
    assert top.evidence["workers"][0]["victims"]["waiting_in"] == GPU_COMM


def test_slow_kernel_with_normal_clock_is_software() -> None:
    kernel = "sm80_xmma_gemm_bf16bf16_bf16f32"
    job = SyntheticJob(
        n_ranks=8, seed=14, gpu=True, faults=[Fault([5], kernel, "gpu_compute", extra_ms=30.0)]
    )
    verdict = verdict_of(run(job))
    top = verdict.findings[0]
    assert (top.ranks, top.category) == ([5], "gpu_compute")
    assert not [f for f in verdict.findings if f.kind == "hardware"]


def test_roles_with_different_functions_are_not_compared() -> None:
    # Two pipeline stages: each runs functions the other never runs (embedding vs head), and
    # stage B is busier. Compared as one group, B's head would be a 'hotspot' on half the
    # ranks; as roles it is normal.
    from tests.analyzer.conftest import CPU_FUNCTIONS

    stage_a = [
        *CPU_FUNCTIONS,
        ("model.py(20): embed_forward", "python", 10.0),
        ("aten::embedding", "cpu_op", 8.0),
    ]
    stage_b = [
        *CPU_FUNCTIONS,
        ("model.py(88): head_forward", "python", 40.0),
        ("aten::log_softmax", "cpu_op", 12.0),
    ]
    roles = {r: stage_a if r < 4 else stage_b for r in range(8)}
    analysis = run(SyntheticJob(n_ranks=8, seed=15, roles=roles))
    assert len(analysis.groups.names) == 2
    assert analysis.groups.labels.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert verdict_of(analysis).status == "healthy", verdict_of(analysis).summary
    # … and a real culprit inside one role is still found.
    job = SyntheticJob(
        n_ranks=8, seed=15, roles=roles, faults=[Fault([6], TOKENIZE, "python", 40.0)]
    )
    assert verdict_of(run(job)).findings[0].ranks == [6]


def test_two_ranks_with_the_same_extra_function_are_not_a_role() -> None:
    job = SyntheticJob(n_ranks=8, seed=20, faults=[Fault([1, 2], TOKENIZE, "python", 40.0)])
    analysis = run(job)
    assert len(analysis.groups.names) == 1
    assert verdict_of(analysis).findings[0].ranks == [1, 2]


def test_a_single_rank_with_an_extra_function_stays_in_its_peer_group() -> None:
    job = SyntheticJob(n_ranks=8, seed=16, faults=[Fault([3], TOKENIZE, "python", 40.0)])
    analysis = run(job)
    assert len(analysis.groups.names) == 1
    assert verdict_of(analysis).findings[0].ranks == [3]


def test_communication_slower_without_peers_working_more_is_reported() -> None:
    # Not a synchronous wait: rank 2's own collective is slower (its step is longer too).
    from tests.analyzer.conftest import COMM as comm_name

    job = SyntheticJob(n_ranks=8, seed=17, faults=[Fault([2], comm_name, "communication", 25.0)])
    analysis = run(job)
    top = verdict_of(analysis).findings[0]
    assert (top.kind, top.ranks, top.category) == ("slow_worker", [2], "communication")
    assert top.evidence["unexplained_ms_per_step"] > 15


def test_two_ranks_never_make_a_communication_outlier() -> None:
    # Two ranks leave each collective together: the one that waits longer only arrived first.
    from tests.analyzer.conftest import COMM as comm_name

    job = SyntheticJob(n_ranks=2, seed=17, faults=[Fault([1], comm_name, "communication", 25.0)])
    verdict = verdict_of(run(job))
    assert not [f for f in verdict.findings if f.category == "communication"], verdict.to_json()


AUTOGRAD_ENTRY = "<built-in method run_backward of torch._C._EngineBase object>"


def test_longer_autograd_without_cpu_samples_is_not_named_in_data_parallel_jobs() -> None:
    # DDP waits for its gradient all-reduce inside the autograd engine: without the CPU
    # accounting that tells work from that wait, a longer backward names nobody.
    job = SyntheticJob(
        n_ranks=4, seed=5, faults=[Fault([1], AUTOGRAD_ENTRY, "python", extra_ms=30.0)]
    )
    analysis = run(job)
    assert not culprit_findings(analysis), verdict_of(analysis).to_json()
    assert any("run_backward" in note and "not named" in note for note in analysis.notes.shown)


def test_findings_sorted_by_severity() -> None:
    job = SyntheticJob(
        n_ranks=8,
        seed=18,
        scale={"dataloader": 40.0},
        faults=[Fault([2], TOKENIZE, "python", 30.0), Fault([6], "aten::mm", "cpu_op", 60.0)],
    )
    findings = verdict_of(run(job)).findings
    assert len(findings) >= 4
    severities = [f.severity for f in findings]
    assert severities == sorted(severities, reverse=True)


def test_reporting_threshold_is_configurable() -> None:
    job = SyntheticJob(n_ranks=4, seed=19, faults=[Fault([1], TOKENIZE, "python", 12.0)])
    assert verdict_of(run(job)).findings[0].ranks == [1]
    strict = verdict_of(run(job, thresholds=Thresholds(report_severity=0.5)))
    assert strict.status == "healthy"
    assert strict.findings == []


@pytest.mark.parametrize("seed", range(4))
def test_victims_waiting_in_python_wait_frames_are_still_victims(seed: int) -> None:
    # On real CPU jobs part of the wait shows as Python `<built-in method wait of …>` frames.
    job = SyntheticJob(
        n_ranks=4,
        seed=seed,
        python_wait_share=0.4,
        faults=[Fault([2], "aten::mm", "cpu_op", extra_ms=40.0)],
    )
    verdict = verdict_of(run(job))
    assert [(f.kind, f.ranks, f.category) for f in verdict.findings if f.kind == "slow_worker"] == [
        ("slow_worker", [2], "cpu_op")
    ]
    assert verdict.findings[0].evidence["workers"][0]["victims"]["ranks"] == [0, 1, 3]


def test_uneven_python_wait_frames_on_a_healthy_job_are_healthy() -> None:
    # As on the real healthy demo: two ranks show 5× more of their wait as a Python frame.
    for seed in range(20):
        job = SyntheticJob(n_ranks=4, seed=2000 + seed, python_wait_share=[0.1, 0.6, 0.1, 0.6])
        verdict = verdict_of(run(job))
        assert verdict.status == "healthy", (seed, verdict.summary)
    # Treated as work, that wait would make ranks 1 and 3 look slow (this is what the
    # collective-wait rule prevents).
    job = SyntheticJob(n_ranks=4, seed=2000, python_wait_share=[0.1, 0.6, 0.1, 0.6])
    analysis = run(job)
    nw, k = analysis.features.non_wait_index, analysis.features.wait_index
    wait_ms = analysis.features.ms[:, k]
    assert wait_ms.max() - wait_ms.min() < 0.1 * analysis.features.mean_step_ms.mean()
    assert analysis.features.ms[:, nw].max() < 1.15 * analysis.features.ms[:, nw].min()


def test_a_single_rank_has_no_peers_but_expected_ranges_apply() -> None:
    healthy = verdict_of(run(SyntheticJob(n_ranks=1, seed=21)))
    assert healthy.status == "healthy"
    assert healthy.summary.startswith("The rank looks healthy")
    starving = verdict_of(run(SyntheticJob(n_ranks=1, seed=21, scale={"dataloader": 50.0})))
    assert starving.status == "healthy"
    assert [(f.kind, f.category, f.ranks) for f in starving.observations] == [
        ("expected_range", "dataloader", [0])
    ]
    assert starving.observations[0].message.startswith("The rank spends")


def test_resource_names_map_to_hardware_categories() -> None:
    assert resource_category("sm_clock_MHz") == ("gpu_hardware", True)
    assert resource_category("bus_bandwidth_GBps") == ("network", True)
    assert resource_category("cpu") == ("host", True)
