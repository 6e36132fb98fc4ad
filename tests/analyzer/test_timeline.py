"""timeline.json.gz: a Chrome-trace file Perfetto opens — valid JSON, the fields every event
type requires, one process per rank, the findings marked; and report.html's collective view."""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


@settings(max_examples=300, deadline=None)
@given(ns=st.lists(st.integers(-(10**15), 10**15), min_size=1, max_size=50))
def test_milliseconds_are_written_as_round_prints_them(ns: list[int]) -> None:
    """Collective calls' wait and transfer, formatted column by column: what `round(ns / 1e6, 4)`
    prints — but at an exact half of 100 ns (rounded half to even here, as the nearest binary
    double falls there) and for a negative value that rounds to zero ("0.0", not "-0.0")."""
    from perfdiag.analyzer.report.timeline import _json_ms

    written = _json_ms(np.array(ns, dtype=np.int64)).to_pylist()
    for value, text in zip(ns, written, strict=True):
        if value % 100 == 50 or (value < 0 and round(value / 1e6, 4) == 0):
            # Compared exactly: in doubles, value / 1e6 itself is off by more than 1e-12 at
            # 10^11 ns and beyond.
            assert abs(Decimal(text) - Decimal(value) / 10**6) <= Decimal("0.00005"), value
        else:
            assert text == repr(round(value / 1e6, 4)), value


def test_each_calls_wait_comes_right_before_its_transfer(tmp_path: Path) -> None:
    TraceJob(n_ranks=4, faults=[TraceFault("compute_straggler", (1,), factor=2.0)]).write(tmp_path)
    analyze(str(tmp_path))
    events = [
        e
        for e in _timeline(tmp_path)["traceEvents"]
        if e["ph"] == "X" and e["tid"] == TID_COLLECTIVES
    ]
    transfers = [i for i, e in enumerate(events) if e["cat"] == "collective_transfer"]
    waits = [i for i, e in enumerate(events) if e["cat"] == "collective_wait"]
    assert len(transfers) > 50 and len(waits) > 20
    for i in waits:
        wait, transfer = events[i], events[i + 1]
        assert transfer["cat"] == "collective_transfer"
        assert wait["name"].removeprefix("wait: ") == transfer["name"].removeprefix("transfer: ")
        assert wait["args"] == transfer["args"] and wait["pid"] == transfer["pid"]
        assert abs(wait["ts"] + wait["dur"] - transfer["ts"]) <= 0.0011
        assert abs(wait["args"]["wait_ms"] - wait["dur"] / 1000) <= 1e-4
    # The straggler arrives last: it hardly waits.
    waited = {
        r: sum(e["dur"] for e in events if e["pid"] == r and "wait" in e["cat"]) for r in range(4)
    }
    assert waited[1] < 0.25 * min(waited[r] for r in (0, 2, 3)), waited
