"""timeline.json.gz: a Chrome-trace file Perfetto opens — valid JSON, the fields every event
type requires, one process per rank, the findings marked; and report.html's collective view."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from perfdiag.analyzer import analyze
from perfdiag.analyzer.report.timeline import FINDINGS_PID, TID_COLLECTIVES, TID_FINDINGS
from perfdiag.storage.local import LocalStorage
from perfdiag_testing.synthetic_trace import TraceFault, TraceJob

REQUIRED = {"X": {"name", "ph", "ts", "dur", "pid", "tid"}, "i": {"name", "ph", "ts", "pid", "s"},
            "M": {"name", "ph", "pid", "args"}}  # fmt: skip


def _timeline(folder: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(gzip.decompress((folder / "timeline.json.gz").read_bytes()))
    return doc


def test_timeline_is_a_valid_merged_trace(tmp_path: Path) -> None:
    TraceJob(n_ranks=4, faults=[TraceFault("slow_link", (2,), factor=3.0)]).write(tmp_path)
    verdict = analyze(str(tmp_path))
    doc = _timeline(tmp_path)
    events = doc["traceEvents"]
    assert isinstance(events, list) and events
    for event in events:
        assert REQUIRED[event["ph"]] <= set(event), event
        assert isinstance(event["pid"], int)
        if event["ph"] == "X":
            assert isinstance(event["ts"], int | float) and event["ts"] >= 0
            assert event["dur"] >= 0
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1", 2: "rank 2", 3: "rank 3", FINDINGS_PID: "findings"}
    # Every rank has its steps, its collectives split into wait and transfer, and raw events
    # on host threads and GPU streams.
    for rank in range(4):
        mine = [e for e in events if e["pid"] == rank and e["ph"] == "X"]
        cats = {e["cat"] for e in mine}
        assert {"step", "collective_transfer", "gpu_compute", "cpu_op"} <= cats, cats
        assert {e["tid"] for e in mine if e["cat"].startswith("collective")} == {TID_COLLECTIVES}
    waits = [e for e in events if e.get("cat") == "collective_wait"]
    waited = {rank: sum(e["dur"] for e in waits if e["pid"] == rank) for rank in range(4)}
    # The slow-link rank arrives last: it waits least, the others wait for it.
    assert waited[2] < 0.25 * min(waited[r] for r in (0, 1, 3)), waited
    # The finding: an instant on the findings track and a span on the culprit's own track.
    top = verdict.findings[0]
    marks = [e for e in events if e.get("cat") == "finding"]
    assert any(e["ph"] == "i" and e["pid"] == FINDINGS_PID for e in marks)
    spans = [e for e in marks if e["ph"] == "X"]
    assert [e["pid"] for e in spans] == top.ranks == [2]
    assert spans[0]["tid"] == TID_FINDINGS and top.message in spans[0]["args"]["message"]


def test_report_shows_collective_wait_and_transfer(tmp_path: Path) -> None:
    TraceJob(n_ranks=4, faults=[TraceFault("compute_straggler", (1,), factor=2.0)]).write(tmp_path)
    analyze(str(tmp_path))
    html = (tmp_path / "report.html").read_text()
    assert "Collectives: waiting vs transfer" in html
    assert "rank 1 (arrived last in" in html
    assert "waiting for the last rank" in html
    assert "<script" not in html.lower()


def test_raw_events_are_the_same_text_in_any_slice_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from perfdiag.analyzer.report import timeline

    traces = tmp_path / "traces"
    TraceJob(n_ranks=2, n_steps=4).write(traces)
    texts = []
    for rows in (1_000_000, 7, 1):
        monkeypatch.setattr(timeline, "ROWS_AT_ONCE", rows)
        out = tmp_path / str(rows)
        analyze(str(traces), LocalStorage(out))
        texts.append(gzip.decompress((out / "timeline.json.gz").read_bytes()))
    raw = [e for e in json.loads(texts[0])["traceEvents"] if e.get("cat") == "gpu_compute"]
    assert len(raw) > 7
    assert texts[1] == texts[0] and texts[2] == texts[0]
