"""The cross-worker stage works on one concatenated table (100,000 ranks: a few seconds, 1,000,000:
tens, docs/benchmarks.md), and what it writes stays readable whatever the number of workers:
verdict.json lists at most MAX_WORKER_ROWS workers one by one (the others as ranges), the report
and the terminal a screenful. A per-rank or quadratic loop would blow the generous bounds below;
a row per rank would blow the sizes."""

from __future__ import annotations

import json
import time

import pytest

from perfdiag.analyzer.pipeline import analyze_capture
from perfdiag.analyzer.report.html import render_report
from perfdiag.analyzer.report.verdict import verdict_of
from perfdiag.api.verdict import MAX_WORKER_ROWS, Verdict
from perfdiag.api.worker import WorkerStatus
from perfdiag.local.verdict_text import render_verdict
from tests.analyzer.conftest import Fault, SyntheticJob, capture_of

CULPRIT = 14_321


@pytest.fixture(scope="module")
def large() -> tuple[Verdict, str, float]:
    """20,000 ranks, one culprit, two stuck and one failed: (verdict, report, seconds)."""
    table, metas = SyntheticJob(
        n_ranks=20_000, seed=1, faults=[Fault([CULPRIT], "train.py(57): tokenize", "python", 40.0)]
    ).build()
    now = 1_700_000_000.0
    statuses = {
        r: WorkerStatus(
            rank=r, phase="capturing", step=7, last_step_unix=now - 900, updated_unix=now
        )
        for r in (17, 18)
    }
    statuses[19] = WorkerStatus(rank=19, phase="failed", updated_unix=now, error="boom")
    capture = capture_of(table, metas, statuses, drop=[17, 18, 19])
    started = time.perf_counter()
    analysis = analyze_capture(capture, expected_ranks=list(range(20_010)))
    html = render_report(analysis, verdict_of(analysis))
    return verdict_of(analysis), html, time.perf_counter() - started


def test_the_culprit_is_found_in_bounded_time(large: tuple[Verdict, str, float]) -> None:
    verdict, _, elapsed = large
    assert elapsed < 60, f"{elapsed:.1f} s for 20,000 ranks"
    assert verdict.status == "hang"
    culprit = next(f for f in verdict.findings if f.kind == "slow_worker")
    assert culprit.ranks == [CULPRIT] and culprit.category == "python"


def test_verdict_lists_the_notable_workers_and_the_others_as_ranges(
    large: tuple[Verdict, str, float],
) -> None:
    verdict, _, _ = large
    rows = {w.rank: w for w in verdict.workers}
    assert len(rows) <= MAX_WORKER_ROWS
    assert rows[CULPRIT].state == "ok" and rows[CULPRIT].host == f"host-{CULPRIT // 8}"
    assert rows[17].state == rows[18].state == "stuck" and rows[19].state == "missing"
    # Every expected rank once: rows, ok ranges, and the ranks with no file at all.
    assert verdict.expected_ranks() == 20_010
    assert [(m.first, m.last) for m in verdict.missing] == [(20_000, 20_009)]
    assert verdict.rank_runs("stuck") == [(17, 18)]
    assert verdict.rank_runs("missing") == [(19, 19), (20_000, 20_009)]
    assert all(r.state == "ok" for r in verdict.worker_ranges)
    ranged = sum(r.last - r.first + 1 for r in verdict.worker_ranges)
    assert ranged + len(rows) + 10 == 20_010
    # Step times: the rows' and the slowest; the others counted.
    times = verdict.window.step_time_ms
    assert str(CULPRIT) in times.per_rank
    assert len(times.per_rank) + times.omitted == 19_997
    assert len(times.per_rank) <= MAX_WORKER_ROWS + 20


def test_written_sizes_do_not_grow_with_the_workers(large: tuple[Verdict, str, float]) -> None:
    verdict, html, _ = large
    text = verdict.to_json()
    assert len(text) < 100_000, len(text)
    assert Verdict.model_validate_json(text) == verdict  # the bounded form round-trips
    assert len(html) < 2_000_000  # the report stays readable: subsets, not 20,000 bars
    terminal = render_verdict(verdict, location="/capture")
    assert len(terminal) < 5_000, terminal
    assert f"{CULPRIT}: " in terminal  # the culprit's step time is printed


def test_a_small_capture_keeps_a_row_per_worker() -> None:
    table, metas = SyntheticJob(n_ranks=8, seed=1).build()
    verdict = verdict_of(analyze_capture(capture_of(table, metas)))
    document = json.loads(verdict.to_json())
    assert [w["rank"] for w in document["workers"]] == list(range(8))
    # The fields added for large captures are absent: earlier readers see what they know.
    assert "worker_ranges" not in document
    assert "omitted" not in document["window"]["step_time_ms"]
    assert len(document["window"]["step_time_ms"]["per_rank"]) == 8
