"""CPU contention on an oversubscribed host: a rank that only waited longer for a core is not
named; a rank that does more work, or the one rank a noisy neighbour starves, still is."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from perfdiag.analyzer.pipeline import analyze_capture
from perfdiag.analyzer.report.analysis import Analysis
from perfdiag.analyzer.report.verdict import verdict_of
from tests.analyzer.conftest import Fault, SyntheticJob, capture_of

MM = "aten::mm"
MM_BASE_MS = 16.0  # conftest.CPU_FUNCTIONS
HOST_CATEGORIES = ("cpu_op", "python", "dataloader")


def with_run_share(
    table: pa.Table, share_of: dict[tuple[int, str], float], peers: float
) -> pa.Table:
    """Give the host rows a `cpu_run_fraction` μ: `peers` everywhere, `share_of[(rank, fn)]`
    where given (what the agent derives from /proc/<pid>/schedstat samples)."""
    ranks = table.column("rank").to_pylist()
    functions = table.column("function").to_pylist()
    categories = table.column("category").to_pylist()
    host = [c in HOST_CATEGORIES for c in categories]
    mu = [
        share_of.get((r, f), peers) if h else None
        for r, f, h in zip(ranks, functions, host, strict=True)
    ]
    resource = ["cpu_run_fraction" if h else None for h in host]
    table = table.set_column(
        table.schema.get_field_index("resource"), "resource", pa.array(resource, pa.string())
    )
    table = table.set_column(
        table.schema.get_field_index("resource_mu"), "resource_mu", pa.array(mu, pa.float64())
    )
    sigma = [0.2 if h else None for h in host]
    return table.set_column(
        table.schema.get_field_index("resource_sigma"), "resource_sigma", pa.array(sigma)
    )


def analyze(extra_ms: float, share_of: dict[tuple[int, str], float], peers: float) -> Analysis:
    job = SyntheticJob(n_ranks=4, seed=5, faults=[Fault([2], MM, "cpu_op", extra_ms=extra_ms)])
    table, metas = job.build()
    return analyze_capture(capture_of(with_run_share(table, share_of, peers), metas))


@pytest.mark.parametrize("peers", [0.5, 0.7])
def test_extra_run_queue_wait_on_an_oversubscribed_host_names_no_rank(peers: float) -> None:
    extra = 14.0
    # Rank 2 runs aten::mm exactly as long as its peers; the extra 14 ms is run-queue wait.
    own_share = MM_BASE_MS * peers / (MM_BASE_MS + extra)
    analysis = analyze(extra, {(2, MM): own_share}, peers)
    verdict = verdict_of(analysis)
    assert verdict.status == "healthy", verdict.to_json()
    assert not verdict.findings
    assert [c.rank for c in analysis.fusion.contended] == [2]
    contended = analysis.fusion.contended[0]
    assert contended.extra_wait_ms == pytest.approx(extra, rel=0.25)
    assert contended.peers_run_share == pytest.approx(peers)
    note = next(n for n in analysis.notes.shown if "waiting for a CPU" in n)
    assert "rank 2" in note and "no rank is named" in note


def test_each_analysis_gathers_its_own_notes() -> None:
    # Two analyses of one capture say their notes once each; the capture keeps what loading
    # found (nothing, for one made in memory).
    job = SyntheticJob(n_ranks=4, seed=5, faults=[Fault([2], MM, "cpu_op", extra_ms=14.0)])
    table, metas = job.build()
    own_share = MM_BASE_MS * 0.5 / (MM_BASE_MS + 14.0)
    capture = capture_of(with_run_share(table, {(2, MM): own_share}, 0.5), metas)
    first, second = analyze_capture(capture), analyze_capture(capture)
    assert len(first.notes.shown) == 1 and "waiting for a CPU" in first.notes.shown[0]
    assert second.notes.shown == first.notes.shown
    assert capture.notes == [] and verdict_of(first).notes == []


def test_more_work_on_an_oversubscribed_host_is_still_a_slow_worker() -> None:
    # Same share of a CPU as the peers: rank 2 does 14 ms more aten::mm work (and waits in
    # proportion): the excess is its own.
    analysis = analyze(14.0, {}, 0.6)
    top = verdict_of(analysis).findings[0]
    assert (top.kind, top.ranks, top.category, top.function) == ("slow_worker", [2], "cpu_op", MM)
    assert not analysis.fusion.contended


def test_a_noisy_neighbour_starving_one_rank_is_host() -> None:
    # The peers get a CPU whenever they are runnable; rank 2 does not: not chance, the host.
    own_share = MM_BASE_MS * 0.98 / (MM_BASE_MS + 14.0)
    analysis = analyze(14.0, {(2, MM): own_share}, 0.98)
    findings = verdict_of(analysis).findings
    assert {(f.kind, tuple(f.ranks), f.category) for f in findings[:2]} == {
        ("slow_worker", (2,), "host"),
        ("hardware", (2,), "host"),
    }
    assert not analysis.fusion.contended


def test_without_host_samples_nothing_changes() -> None:
    job = SyntheticJob(n_ranks=4, seed=5, faults=[Fault([2], MM, "cpu_op", extra_ms=14.0)])
    table, metas = job.build()
    analysis = analyze_capture(capture_of(table, metas))
    assert verdict_of(analysis).findings[0].ranks == [2]
    assert not analysis.fusion.contended
    assert np.all(np.isnan(table.column("resource_mu").to_numpy(zero_copy_only=False)))


def test_one_functions_cpu_share_on_an_oversubscribed_host_is_not_hardware() -> None:
    # No extra work anywhere; rank 1's data loading happened to get less CPU than its peers'
    # on a host where every rank waits for one: chance, not a hardware finding.
    loader = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
    job = SyntheticJob(n_ranks=4, seed=5)
    table, metas = job.build()
    table = with_run_share(table, {(r, loader): 0.96 for r in (0, 2, 3)} | {(1, loader): 0.4}, 0.6)
    analysis = analyze_capture(capture_of(table, metas))
    assert verdict_of(analysis).status == "healthy", verdict_of(analysis).to_json()
    assert not analysis.anomalies
    assert any("rank 1" in n and "oversubscribed" in n for n in analysis.notes.shown)
    # The same rank on a host where the peers get a CPU: the host is named.
    table = with_run_share(table, {(r, loader): 0.96 for r in (0, 2, 3)} | {(1, loader): 0.4}, 0.97)
    analysis = analyze_capture(capture_of(table, metas))
    assert [(a.rank, a.function) for a in analysis.anomalies] == [(1, loader)]
