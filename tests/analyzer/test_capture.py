"""analyze() on captures written through perfdiag.storage: loading, missing and stuck workers,
the verdict.json contract."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perfdiag.analyzer import CaptureError, NoCaptureError, Thresholds, analyze
from perfdiag.api.verdict import Verdict
from perfdiag.api.worker import WorkerStatus
from perfdiag.storage import layout
from perfdiag.storage.local import LocalStorage
from tests.analyzer.conftest import Fault, SyntheticJob, write_capture

TOKENIZE = "train.py(57): tokenize"
NOW = 1_700_000_000.0


def test_analyze_a_local_capture_folder_by_path(local_storage: LocalStorage) -> None:
    table, metas = SyntheticJob(
        n_ranks=4, seed=1, faults=[Fault([2], TOKENIZE, "python", 40)]
    ).build()
    write_capture(local_storage, table, metas)
    messages: list[str] = []
    verdict = analyze(str(local_storage.root), progress=messages.append)
    assert verdict.status == "degraded"
    assert verdict.findings[0].ranks == [2]
    assert [w.rank for w in verdict.workers] == [0, 1, 2, 3]
    assert all(w.state == "ok" and w.host == "host-0" for w in verdict.workers)
    assert "loaded 4/4 workers" in messages
    # Written next to the capture; verdict.json is exactly the model (round trip).
    text = local_storage.get_text(layout.VERDICT)
    assert Verdict.model_validate_json(text) == verdict
    data = json.loads(text)
    assert data["schema"] == "perfdiag.verdict/v1"
    assert set(data) == {"schema", "status", "summary", "window", "workers", "findings", "notes"}
    assert set(data["window"]["step_time_ms"]["per_rank"]) == {"0", "1", "2", "3"}
    assert data["window"]["start_step"] == 6 and data["window"]["steps"] == 10
    assert local_storage.exists(layout.REPORT)


def test_verdict_round_trips_through_the_model(local_storage: LocalStorage) -> None:
    table, metas = SyntheticJob(
        n_ranks=8, seed=2, faults=[Fault([5], "aten::mm", "cpu_op", 50)]
    ).build()
    write_capture(local_storage, table, metas)
    verdict = analyze(local_storage)
    again = Verdict.model_validate(json.loads(verdict.to_json()))
    assert again == verdict
    assert again.to_json() == verdict.to_json()
    # Evidence is plain JSON (no numpy scalars, no NaN).
    json.loads(verdict.to_json(), parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))


def test_output_can_go_to_another_storage(local_storage: LocalStorage, tmp_path: Path) -> None:
    table, metas = SyntheticJob(n_ranks=4, seed=3).build()
    write_capture(local_storage, table, metas)
    out = LocalStorage(tmp_path / "elsewhere")
    verdict = analyze(local_storage, out)
    assert verdict.status == "healthy"
    assert out.exists(layout.VERDICT) and out.exists(layout.REPORT)
    assert not local_storage.exists(layout.VERDICT)


def test_missing_worker_makes_the_verdict_incomplete_and_names_it(
    local_storage: LocalStorage,
) -> None:
    table, metas = SyntheticJob(n_ranks=4, seed=4).build()
    # Rank 3 reported progress but never uploaded its summary.
    status = WorkerStatus(
        rank=3,
        host="host-0",
        plan_id="w1",
        phase="capturing",
        step=12,
        last_step_unix=NOW,
        updated_unix=NOW,
    )
    write_capture(local_storage, table, metas, drop=[3], statuses={3: status})
    verdict = analyze(local_storage)
    assert verdict.status == "incomplete"
    states = {w.rank: w.state for w in verdict.workers}
    assert states == {0: "ok", 1: "ok", 2: "ok", 3: "missing"}
    assert verdict.summary.startswith("Rank 3 is missing")
    assert "phase capturing at step 12" in verdict.summary
    assert "the 3 analysed ranks look healthy" in verdict.summary
    assert set(verdict.window.step_time_ms.per_rank) == {"0", "1", "2"}


def test_expected_ranks_name_workers_that_left_no_file(local_storage: LocalStorage) -> None:
    table, metas = SyntheticJob(
        n_ranks=4, seed=5, faults=[Fault([1], TOKENIZE, "python", 40)]
    ).build()
    write_capture(local_storage, table, metas)
    verdict = analyze(local_storage, expected_ranks=list(range(6)))
    assert verdict.status == "incomplete"
    # No file at all: a range of verdict.missing, no row of verdict.workers.
    assert [w.rank for w in verdict.workers] == [0, 1, 2, 3]
    assert [(m.first, m.last, m.reason) for m in verdict.missing] == [
        (4, 5, "no file in the capture")
    ]
    assert verdict.rank_runs("missing") == [(4, 5)]
    assert "Ranks 4,5 are missing" in verdict.summary
    # The slow worker is still reported.
    assert verdict.findings[0].ranks == [1]
    assert "rank 1 is slowing the job" in verdict.summary


def test_world_size_names_missing_ranks(local_storage: LocalStorage) -> None:
    table, metas = SyntheticJob(n_ranks=4, seed=6).build()
    write_capture(local_storage, table, metas, drop=[0])  # no file at all for rank 0
    verdict = analyze(local_storage)
    assert verdict.status == "incomplete"
    assert [w.rank for w in verdict.workers] == [1, 2, 3]
    assert [(m.first, m.last) for m in verdict.missing] == [(0, 0)]
    assert "no file of this worker" in verdict.summary


def test_failed_window_is_missing_with_its_error(local_storage: LocalStorage) -> None:
    table, metas = SyntheticJob(n_ranks=4, seed=7).build()
    failed = WorkerStatus(
        rank=2,
        phase="failed",
        step=14,
        updated_unix=NOW,
        error="torch.profiler failed: out of memory",
    )
    write_capture(local_storage, table, metas, drop=[2], statuses={2: failed})
    verdict = analyze(local_storage)
    assert verdict.status == "incomplete"
    assert "out of memory" in verdict.summary


def test_live_worker_whose_step_stopped_is_stuck(local_storage: LocalStorage) -> None:
    table, metas = SyntheticJob(n_ranks=4, seed=8).build()
    # Heartbeats keep coming (updated now) but the last step ended 10 minutes ago.
    stuck = WorkerStatus(
        rank=1, phase="capturing", step=9, last_step_unix=NOW - 600, updated_unix=NOW
    )
    write_capture(local_storage, table, metas, drop=[1], statuses={1: stuck})
    stacks = {
        "rank": 1,
        "threads": [
            {
                "thread_id": 1,
                "name": "MainThread",
                "daemon": False,
                "frames": [
                    {"file": "train.py", "line": 80, "function": "main"},
                    {
                        "file": "torch/distributed/distributed_c10d.py",
                        "line": 2501,
                        "function": "all_reduce",
                    },
                ],
            }
        ],
    }
    local_storage.put_text(layout.worker_key(1, layout.STACKS), json.dumps(stacks))
    verdict = analyze(local_storage)
    assert verdict.status == "hang"
    assert {w.rank: w.state for w in verdict.workers}[1] == "stuck"
    hang = verdict.findings[0]
    assert (hang.kind, hang.ranks, hang.category, hang.severity) == (
        "hang",
        [1],
        "communication",
        1.0,
    )
    assert hang.evidence["workers"][0]["stack"][0].startswith(
        "torch/distributed/distributed_c10d.py"
    )
    assert verdict.summary.startswith("Rank 1 is stuck at step 9")


def test_worker_whose_heartbeat_stopped_too_is_missing_not_stuck(
    local_storage: LocalStorage,
) -> None:
    table, metas = SyntheticJob(n_ranks=4, seed=9).build()
    gone = WorkerStatus(
        rank=1, phase="capturing", step=9, last_step_unix=NOW - 600, updated_unix=NOW - 599
    )
    write_capture(local_storage, table, metas, drop=[1], statuses={1: gone})
    verdict = analyze(local_storage)
    assert verdict.status == "incomplete"
    assert "heartbeat stopped" in verdict.summary


def test_stuck_threshold_is_configurable(local_storage: LocalStorage) -> None:
    table, metas = SyntheticJob(n_ranks=4, seed=10).build()
    slowish = WorkerStatus(
        rank=1, phase="capturing", step=9, last_step_unix=NOW - 90, updated_unix=NOW
    )
    write_capture(local_storage, table, metas, drop=[1], statuses={1: slowish})
    assert analyze(local_storage).status == "hang"
    patient = Thresholds(stuck_after_seconds=300)
    assert analyze(local_storage, thresholds=patient).status == "incomplete"


def test_events_only_the_timeline_reads_are_noted_in_verdict_and_report(
    local_storage: LocalStorage,
) -> None:
    """A healthy rank's raw events are read by the timeline alone, after the comparison: a
    corrupt file is still said in verdict.json's notes and the report's."""
    table, metas = SyntheticJob(
        n_ranks=4, seed=1, faults=[Fault([2], TOKENIZE, "python", 40)]
    ).build()
    write_capture(local_storage, table, metas)
    local_storage.put_bytes(layout.worker_key(0, layout.EVENTS), b"PAR1 this is not parquet")
    verdict = analyze(local_storage)
    assert verdict.findings[0].ranks == [2]
    events = local_storage.uri_of(layout.worker_key(0, layout.EVENTS))
    noted = [n for n in verdict.notes if n.startswith(f"ignored {events}")]
    assert len(noted) == 1, verdict.notes
    assert Verdict.model_validate_json(local_storage.get_text(layout.VERDICT)) == verdict
    assert f"ignored {events}" in local_storage.get_text(layout.REPORT)


def test_unreadable_summary_is_a_missing_worker_not_a_crash(local_storage: LocalStorage) -> None:
    table, metas = SyntheticJob(n_ranks=4, seed=11).build()
    write_capture(local_storage, table, metas)
    local_storage.put_bytes(layout.worker_key(2, layout.SUMMARY), b"PAR1 this is not parquet")
    verdict = analyze(local_storage)
    assert verdict.status == "incomplete"
    assert {w.rank: w.state for w in verdict.workers}[2] == "missing"
    assert "not a readable Parquet file" in verdict.summary


def test_summary_of_unknown_schema_version_is_refused(local_storage: LocalStorage) -> None:
    import pyarrow as pa

    from perfdiag.api.schema import META_SCHEMA
    from perfdiag.engine.parquet_io import table_to_bytes

    table, metas = SyntheticJob(n_ranks=2, seed=12).build()
    write_capture(local_storage, table, metas)
    key = layout.worker_key(1, layout.SUMMARY)
    from perfdiag.engine.parquet_io import table_from_bytes

    current = table_from_bytes(local_storage.get_bytes(key))
    meta = dict(current.schema.metadata)
    meta[META_SCHEMA] = b"perfdiag.summary/v9"
    local_storage.put_bytes(key, table_to_bytes(current.replace_schema_metadata(meta)))
    verdict = analyze(local_storage)
    assert {w.rank: w.state for w in verdict.workers}[1] == "missing"
    assert "perfdiag.summary/v9" in verdict.summary
    assert isinstance(pa.table({"x": [1]}), pa.Table)


def test_all_workers_failed_gives_an_incomplete_verdict(local_storage: LocalStorage) -> None:
    for rank in range(2):
        status = WorkerStatus(rank=rank, phase="failed", updated_unix=NOW, error="no trace")
        local_storage.put_text(layout.worker_key(rank, layout.STATUS), status.model_dump_json())
    verdict = analyze(local_storage)
    assert verdict.status == "incomplete"
    assert verdict.window.step_time_ms.per_rank == {}
    assert verdict.summary.startswith("Ranks 0,1 are missing")
    assert local_storage.exists(layout.REPORT)


def test_empty_folder_holds_no_capture(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(
        NoCaptureError, match=r"looked for plan\.json, workers/<rank>/summary\.parquet"
    ):
        analyze(str(tmp_path / "empty"))


def test_nonexistent_folder_holds_no_capture(tmp_path: Path) -> None:
    with pytest.raises(NoCaptureError, match="does not exist"):
        analyze(str(tmp_path / "nope"))


def test_capture_error_is_an_analyzer_error() -> None:
    from perfdiag.analyzer import AnalyzerError

    assert issubclass(CaptureError, AnalyzerError)
    assert issubclass(NoCaptureError, AnalyzerError)
