"""The synthetic GPU fault matrix through the real path: Kineto trace files on disk →
`analyze()` → verdict.json. Each fault on one rank must be named with its category; a healthy
job and an imbalanced pipeline must give no finding (docs/analysis.md, "Fault matrix")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perfdiag.analyzer import analyze
from perfdiag.analyzer.compare.peers import one_group
from perfdiag.analyzer.load.capture_folder import load_capture
from perfdiag.analyzer.pipeline import analyze_capture
from perfdiag.analyzer.report.verdict import verdict_of
from perfdiag.storage import open_storage
from perfdiag_testing.fault_matrix import CULPRIT, RANKS, Scenario, scenarios
from perfdiag_testing.synthetic_trace import TraceFault, TraceJob

SCENARIOS = {s.name: s for s in scenarios(seed=0)}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_fault_matrix(name: str, tmp_path: Path) -> None:
    scenario: Scenario = SCENARIOS[name]
    scenario.job.write(tmp_path / "traces")
    verdict = analyze(str(tmp_path / "traces"), out=None)
    written = json.loads((tmp_path / "traces" / "verdict.json").read_text())
    assert written["status"] == verdict.status
    if scenario.culprit is None:
        assert verdict.status == "healthy", [f.message for f in verdict.findings]
        assert verdict.findings == []
        return
    assert verdict.status == "degraded"
    top = verdict.findings[0]
    assert top.ranks == [scenario.culprit], top.message
    assert top.category == scenario.category, top.message
    if scenario.function is not None:
        assert top.function is not None and scenario.function in top.function
    # No other rank is blamed for anything.
    for finding in verdict.findings:
        assert finding.ranks == [scenario.culprit], finding.message


def test_healthy_runs_stay_quiet_over_seeds(tmp_path: Path) -> None:
    for seed in range(1, 4):
        folder = tmp_path / f"seed-{seed}"
        TraceJob(n_ranks=RANKS, seed=seed, clock_skew_us=20.0).write(folder)
        verdict = analyze(str(folder))
        assert verdict.findings == [], (seed, [f.message for f in verdict.findings])


def test_slow_link_names_victims_and_bandwidth(tmp_path: Path) -> None:
    TraceJob(n_ranks=RANKS, faults=[TraceFault("slow_link", (CULPRIT,), factor=3.0)]).write(
        tmp_path
    )
    finding = analyze(str(tmp_path)).findings[0]
    evidence = finding.evidence
    assert finding.kind == "slow_worker" and finding.category == "network"
    # The others wait for it: victims, not culprits.
    assert sorted(evidence["victims"]["ranks"]) == [r for r in range(RANKS) if r != CULPRIT]
    # Its achieved bus bandwidth is about a third of its peers' (80 GB/s in the generator).
    assert evidence["peers_median_busbw_GBps"] == pytest.approx(80.0, rel=0.1)
    assert evidence["busbw_GBps"] < 0.5 * evidence["peers_median_busbw_GBps"]
    assert evidence["collectives"]["arrived_last_share"] > 0.5


def test_straggler_is_the_late_arriver(tmp_path: Path) -> None:
    TraceJob(n_ranks=RANKS, faults=[TraceFault("compute_straggler", (CULPRIT,), factor=2.0)]).write(
        tmp_path
    )
    finding = analyze(str(tmp_path)).findings[0]
    late = finding.evidence["collectives"][str(CULPRIT)]
    # It arrives last at (nearly) every collective and waits least; the others wait for it.
    assert late["arrived_last_share"] > 0.9
    assert late["caused_wait_ms_per_step"] > 1.0
    assert late["wait_ms_per_step"] < 0.1


def test_pipeline_roles_come_from_process_groups(tmp_path: Path) -> None:
    """Without roles, the heavier stage looks like two slow workers; with roles from the
    collectives each stage is compared with its own replicas only."""
    scenario = SCENARIOS["imbalanced pipeline (4 stages, last has 10 layers vs 6)"]
    scenario.job.write(tmp_path)
    capture = load_capture(open_storage(str(tmp_path)))
    with_roles = analyze_capture(capture)
    assert "process-group" in with_roles.groups.basis
    assert len(with_roles.groups.names) == 2
    assert verdict_of(with_roles).findings == []
    without = analyze_capture(capture, roles=one_group)
    assert verdict_of(without).findings, "the imbalance must be visible when roles are ignored"
    assert verdict_of(without).findings[0].ranks == [6, 7]
