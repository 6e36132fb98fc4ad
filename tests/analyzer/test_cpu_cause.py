"""Why a rank is slow, from its process's CPU accounting against its peers' (analyzer/signals/cpu_cause.py)."""

from __future__ import annotations

import numpy as np
import pytest

from perfdiag.analyzer.signals.cpu_cause import (
    CpuWork,
    PeerCpu,
    RankCpu,
    cpu_work_excess,
    explain_excess,
    held_back,
    host_note,
)

PEERS = np.arange(4)
STEP = 40.0
MATERIAL = 0.05 * STEP


def beside_peers(rank_cpu: RankCpu, i: int = 2, material_ms: float = MATERIAL) -> PeerCpu:
    """Rank `i`'s CPU accounting beside the other three's."""
    return PeerCpu.of(rank_cpu, i, PEERS, material_ms)


def cpu(**changes: list[float]) -> RankCpu:
    """Four ranks alike (8 ms on a CPU, 1 ms waiting for one, 2 ms of other threads per step),
    with `changes` per field."""
    base = {
        "on_cpu": [8.0, 8.1, 7.9, 8.0],
        "cpu_wait": [1.0, 1.1, 0.9, 1.0],
        "other_threads": [2.0, 2.2, 1.9, 2.1],
        "process_wait": [3.0, 3.2, 2.9, 3.1],
        "throttled": [0.0, 0.0, 0.0, 0.0],
        "off_cpu": [0.2, 0.1, 0.3, 0.2],
        "threads": [6.0, 6.0, 6.0, 6.0],
        "quota_cores": [np.nan] * 4,
        "host_load": [0.5] * 4,
    }
    base.update(changes)
    return RankCpu(
        **{k: np.array(v, dtype=float) for k, v in base.items()},
        host_runnable=3.0,
        host_cores=4,
    )


def test_extra_computation_is_work() -> None:
    cause = explain_excess(beside_peers(cpu(on_cpu=[8.0, 8.1, 20.0, 8.0])), 12.0)
    assert cause.kind == "work"
    assert cause.evidence["on_cpu_ms_per_step"] == {"rank": 20.0, "peers_median": 8.0}


def test_sleeping_in_user_code_is_blocked_not_work() -> None:
    cause = explain_excess(beside_peers(cpu(off_cpu=[0.2, 0.1, 20.3, 0.2])), 20.0)
    assert cause.kind == "blocked"
    assert "off-CPU" in cause.sentence and "not computing" in cause.sentence


def with_children(base: RankCpu, run: list[float], wait: list[float]) -> RankCpu:
    return RankCpu(
        **{**base.__dict__, "children_cpu": np.array(run), "children_wait": np.array(wait)}
    )


def test_blocked_on_data_loader_workers_that_waited_for_a_cpu_is_not_named() -> None:
    """Its DataLoader workers got no CPU for a while on a busy host, computing no more than
    the peers' workers: the rank waited for its batches by chance."""
    blocked = cpu(off_cpu=[0.2, 0.1, 20.3, 0.2])
    waited = with_children(blocked, [9.0, 9.2, 9.1, 8.9], [2.0, 1.8, 25.0, 2.1])
    cause = explain_excess(beside_peers(waited), 20.0)
    assert cause.kind == "contended"
    assert "DataLoader workers" in cause.sentence and "not named" in cause.sentence
    assert cause.evidence["children_wait_ms_per_step"] == {"rank": 25.0, "peers_median": 2.0}


def test_blocked_on_data_loader_workers_that_compute_more_is_named() -> None:
    blocked = cpu(off_cpu=[0.2, 0.1, 20.3, 0.2])
    slow_workers = with_children(blocked, [9.0, 9.2, 30.0, 8.9], [2.0, 1.8, 12.0, 2.1])
    cause = explain_excess(beside_peers(slow_workers), 20.0)
    assert cause.kind == "blocked"
    assert "child processes (DataLoader workers) computed 21.0 ms/step longer" in cause.sentence


def test_a_slow_data_loader_worker_is_named_however_long_a_busy_host_makes_the_step() -> None:
    """At load 12 the step is 90 ms and 5% of it (4.5 ms) is more than the slow worker's extra
    CPU time (4.3 ms/step on 2.6): its workers still computed more than its peers'."""
    blocked = cpu(off_cpu=[0.2, 0.1, 20.3, 0.2])
    slow_worker = with_children(blocked, [2.6, 2.6, 6.9, 2.6], [9.0, 8.0, 25.6, 9.5])
    cause = explain_excess(beside_peers(slow_worker, material_ms=4.5), 19.0)
    assert cause.kind == "blocked"
    assert "child processes (DataLoader workers) computed 4.3 ms/step longer" in cause.sentence


def test_a_busy_background_thread_is_threads() -> None:
    cause = explain_excess(
        beside_peers(cpu(other_threads=[2.0, 2.2, 30.0, 2.1], off_cpu=[0.2, 0.1, 9.0, 0.2])), 9
    )
    assert cause.kind == "threads"


def test_a_rank_waiting_for_its_own_gpu_work_is_named_for_the_gpu_not_its_threads() -> None:
    """Measured on an H100 (gloo, two ranks on one GPU, extra matrix products on one): while
    its kernels ran, its training thread slept in a synchronize and gloo's thread spun in the
    device-to-host copy of the gradients, 59 ms/step of CPU more than its peer's."""
    waiting = cpu(other_threads=[2.0, 2.2, 61.0, 2.1], off_cpu=[0.2, 0.1, 30.6, 0.2])
    assert explain_excess(beside_peers(waiting), 31.5).kind == "threads"
    cause = explain_excess(beside_peers(waiting), 31.5, gpu_ms=34.0)
    assert cause.kind == "device"
    assert "its GPU spent 34.0 ms/step longer" in cause.sentence
    assert cause.evidence["other_threads_cpu_ms_per_step"] == {"rank": 61.0, "peers_median": 2.1}


def test_a_little_gpu_time_does_not_explain_a_cpu_cause() -> None:
    busy = cpu(other_threads=[2.0, 2.2, 30.0, 2.1], off_cpu=[0.2, 0.1, 9.0, 0.2])
    assert explain_excess(beside_peers(busy), 9.0, gpu_ms=3.0).kind == "threads"
    assert explain_excess(beside_peers(busy), 9.0, gpu_ms=1.0).kind == "threads"


def test_a_cpu_quota_outranks_gpu_time() -> None:
    held = cpu(throttled=[0.0, 0.0, 30.0, 0.0], cpu_wait=[1.0, 1.1, 31.0, 1.0])
    assert explain_excess(beside_peers(held), 30.0, gpu_ms=20.0).kind == "throttled"


def test_a_rank_computing_longer_step_by_step_is_named_for_that_work_alone() -> None:
    """Most of its functions' 12 ms/step more is waiting for a CPU, but its training thread
    computes longer step by step: the cause is that computation, and carries it."""
    waiting = cpu(on_cpu=[8.0, 8.1, 12.0, 8.0], cpu_wait=[1.0, 1.1, 13.0, 1.0])
    assert explain_excess(beside_peers(waiting), 12.0).kind == "contended"
    work = CpuWork(4.5, 12.0, 8.0, 8, 8, 1.5)
    cause = explain_excess(beside_peers(waiting), 12.0, work=work)
    assert cause.kind == "work" and cause.work is work and cause.excess_ms == 4.5


def test_other_threads_noise_of_a_few_ms_names_nothing() -> None:
    # gloo's and the profiler's threads differ by ~2 ms between healthy ranks.
    cause = explain_excess(beside_peers(cpu(other_threads=[2.0, 2.2, 4.0, 2.1])), 3.0)
    assert cause.kind == "contended"


def test_excess_that_is_only_waiting_for_a_cpu_is_contended() -> None:
    cause = explain_excess(beside_peers(cpu(cpu_wait=[1.0, 1.1, 9.0, 1.0])), 8.0)
    assert cause.kind == "contended"
    assert "not named" in cause.sentence


def test_a_cpu_quota_holds_the_rank_back() -> None:
    held = held_back(
        beside_peers(cpu(throttled=[0.0, 0.0, 30.0, 0.0], cpu_wait=[1.0, 1.1, 31.0, 1.0]))
    )
    assert held is not None and held.kind == "throttled"
    assert held.excess_ms == pytest.approx(30.0)


def test_throttling_is_weighed_against_the_typical_step_when_given() -> None:
    """Fault suite, cpu-quota beside a CPU hog: two steps of 0.8-1.1 s on every rank (the
    whole host stalled) put the mean step at 222 ms and 5% of it at 11 ms, above the rank's
    8.9 ms/step of throttling; its median step was 42 ms."""
    quota = cpu(throttled=[0.0, 0.0, 8.9, 0.0], cpu_wait=[6.0, 4.9, 9.6, 8.1])
    assert held_back(beside_peers(quota, material_ms=11.1)) is None
    held = held_back(beside_peers(quota, material_ms=11.1), throttled_material_ms=2.1)
    assert held is not None and held.kind == "throttled"
    # The typical step's threshold is for throttling only: the same wait names nothing else.
    assert (
        held_back(beside_peers(cpu(cpu_wait=[6.0, 4.9, 9.6, 8.1]), material_ms=11.1), 2.1) is None
    )


def test_waiting_for_a_cpu_on_its_own_busy_host_while_the_peers_get_one_is_starved() -> None:
    starved = cpu(cpu_wait=[0.1, 0.2, 12.0, 0.1], host_load=[0.5, 0.5, 1.5, 0.5])
    held = held_back(beside_peers(starved))
    assert held is not None and held.kind == "starved"
    # The same wait on the host the peers share: chance, not the rank.
    shared = cpu(cpu_wait=[0.1, 0.2, 12.0, 0.1], host_load=[1.5] * 4)
    assert held_back(beside_peers(shared)) is None


def test_waiting_for_a_cpu_where_every_rank_waits_is_chance() -> None:
    # Peers run only ~60% of their runnable time: an oversubscribed host.
    busy = cpu(cpu_wait=[5.0, 5.5, 14.0, 5.2])
    assert held_back(beside_peers(busy)) is None


def test_the_host_note_says_runnable_threads_and_cores() -> None:
    loaded = RankCpu(
        **{k: v for k, v in cpu().__dict__.items() if k not in ("host_runnable", "host_cores")},
        host_runnable=7.5,
        host_cores=2,
    )
    note = host_note(loaded)
    assert note is not None and "7.5 runnable threads on 2 cores" in note
    assert host_note(cpu()) is None


def test_a_nic_shared_by_the_ranks_of_a_host_names_none_of_them() -> None:
    from perfdiag.analyzer.signals.hardware import ResourceAnomaly, without_shared_host_resources

    def network(rank: int) -> ResourceAnomaly:
        return ResourceAnomaly(
            rank=rank,
            function="gloo:all_reduce",
            category="communication",
            resource="net_bytes_per_s",
            hardware_category="network",
            mu=60.0,
            peers_mu=100.0,
            sigma=None,
            peers_sigma=None,
            deviation=-0.4,
            unstable=False,
        )

    shared, notes = without_shared_host_resources([network(0)], {0: "a", 1: "a"})
    assert shared == [] and "share its NIC counters" in notes[0]
    own, notes = without_shared_host_resources([network(0)], {0: "a", 1: "b"})
    assert own == [network(0)] and notes == []


def per_step(rows: list[list[float]]) -> RankCpu:
    """Four ranks with exact per-step on-CPU times `rows` (ms), waiting half their time."""
    steps = np.array(rows, dtype=float)
    means = steps[:, 1:-1].mean(axis=1)
    base = cpu(on_cpu=list(means), cpu_wait=list(means))
    return RankCpu(**{**base.__dict__, "on_cpu_steps": steps})


def test_a_rank_computing_longer_in_every_step_is_found_on_a_busy_host() -> None:
    rng = np.random.default_rng(1)
    rows = 6.0 + 0.3 * rng.standard_normal((4, 10))
    rows[3] += 2.0  # 2 ms of extra computation a step, every step
    work = cpu_work_excess(beside_peers(per_step(rows.tolist()), 3))
    assert work is not None
    # Half of every rank's time is run-queue wait: each extra ms on a CPU costs two.
    assert work.excess_ms == pytest.approx(4.0, abs=0.6)
    assert work.steps_shown == work.steps == 8
    # Its best step: about 8 ms against its peers' 6.
    assert work.floor_ratio == pytest.approx(8.0 / 6.0, abs=0.12)
    assert cpu_work_excess(beside_peers(per_step(rows.tolist()), 0)) is None


# Exact on-CPU ms of each rank's training thread in each step of two fault-suite runs (4 ranks
# on 2 cores, quiet host; benchmarks/fault_suite.py).
LARGER_BATCH = [  # rank 1 trains a 3x batch: the same calls, each longer
    [9.18, 8.95, 9.68, 8.81, 10.5, 10.35, 9.75, 9.19, 8.86, 9.68],
    [11.18, 12.85, 13.43, 11.72, 11.17, 10.67, 10.59, 15.09, 14.76, 16.28],
    [8.74, 9.37, 9.54, 6.43, 7.1, 6.38, 6.58, 7.86, 9.77, 11.05],
    [9.16, 9.39, 10.94, 6.26, 10.51, 9.6, 9.19, 7.41, 10.54, 10.66],
]
SHARED_CORE = [  # `cpu-quota`: rank 1 is healthy (rank 2 is throttled), 1.3x its peers
    [6.32, 6.24, 6.51, 5.84, 6.37, 5.87, 6.2, 5.73, 6.29, 6.34],
    [8.57, 7.62, 8.61, 6.78, 9.07, 8.39, 7.3, 7.65, 9.07, 7.56],
    [7.88, 7.96, 7.61, 7.23, 8.96, 8.45, 7.57, 8.13, 8.8, 7.78],
    [6.04, 5.94, 6.64, 5.59, 6.42, 6.14, 5.63, 5.83, 6.13, 6.08],
]


def per_step_ratio_quartile(rows: list[list[float]], i: int) -> float:
    inner = np.array(rows)[:, 1:-1]
    peers = np.median(np.delete(inner, i, axis=0), axis=0)
    return float(np.quantile(inner[i] / peers, 0.25))


def test_more_work_per_call_shows_in_the_ranks_best_step() -> None:
    """The peers' median switches between their fast and slow steps (which ranks share a
    core), so step by step a 3x batch is at times barely above it, less often than a healthy
    rank on a shared core is; its best step against theirs tells them apart."""
    assert per_step_ratio_quartile(LARGER_BATCH, 1) < per_step_ratio_quartile(SHARED_CORE, 1)
    larger = cpu_work_excess(beside_peers(per_step(LARGER_BATCH), 1))
    healthy = cpu_work_excess(beside_peers(per_step(SHARED_CORE), 1))
    assert larger is not None and healthy is not None
    assert larger.floor_ratio == pytest.approx(10.59 / 6.38)
    assert healthy.floor_ratio == pytest.approx(6.78 / 5.73)


def test_a_rank_stalling_every_third_step_is_found_and_recurring() -> None:
    rows = np.full((4, 10), 6.0)
    rows[2, ::3] += 20.0
    work = cpu_work_excess(beside_peers(per_step(rows.tolist())))
    assert work is not None and work.steps_shown == 2 and work.steps == 8


def test_work_that_moves_from_rank_to_rank_names_no_rank() -> None:
    """Uneven inputs: every rank's work swings from step to step; one rank's slightly larger
    mean is no rank's fault (imbalance reports it)."""
    rng = np.random.default_rng(7)
    rows = rng.choice([3.0, 6.0, 12.0, 24.0], size=(4, 10)) * 0.4 + 5.0
    rows[1] += 1.5
    found = [cpu_work_excess(beside_peers(per_step(rows.tolist()), i)) for i in range(4)]
    assert found == [None] * 4


def test_without_exact_counters_no_rank_is_judged_step_by_step() -> None:
    assert cpu_work_excess(beside_peers(cpu(on_cpu=[8.0, 8.0, 20.0, 8.0]))) is None


def test_extra_threads_on_an_oversubscribed_host_hold_the_job_back() -> None:
    """A rank whose other threads burn 30 ms/step more CPU on a host with more runnable threads
    than cores: every rank waits for those cores alike, its own training thread no more than the
    others; it is held back for the CPU it takes, spread over the cores."""
    busy = cpu(other_threads=[2.0, 2.2, 32.0, 2.1], host_load=[2.5] * 4)
    cause = held_back(beside_peers(busy))
    assert cause is not None and cause.kind == "threads"
    assert cause.excess_ms == pytest.approx(29.9 / 4)  # host_cores=4
    # The same threads on a host with cores to spare take nothing from the others.
    assert held_back(beside_peers(cpu(other_threads=[2.0, 2.2, 32.0, 2.1]))) is None
