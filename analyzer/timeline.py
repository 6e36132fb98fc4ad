"""timeline.json.gz: the analysed window as one Chrome-trace / Perfetto file, ranks merged.

Layout (open it in https://ui.perfetto.dev or chrome://tracing):
  * one process per rank (pid = rank, "rank N", sorted by rank) with
      - tid 1 "steps": the window's steps;
      - tid 2 "collectives (wait | transfer)": each matched collective call split into the part
        spent waiting for the last rank and the transfer (analyzer/collectives.py);
      - for a few ranks (those named in findings, then their lowest-numbered peers): the raw
        events, host threads and GPU streams (tid 1000 + stream), re-read from the rank's trace
        (Kineto folders) or events.parquet (captures that kept raw events);
      - tid 3 "findings": one span over the window per finding naming the rank;
  * a "findings" process (pid FINDINGS_PID) with one instant event per finding.
Timestamps are µs from the earliest window start on the trace clocks (Kineto writes the host
clock, so ranks line up as well as the hosts' clocks agree). Above MAX_RANKS ranks only the
ranks named in findings and an even sample are included; detailed events are capped per rank.
"""

from __future__ import annotations

import gzip
import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfdiag.storage import Storage, StorageNotFound, layout

if TYPE_CHECKING:
    from perfdiag.analyzer.pipeline import Analysis

MAX_RANKS = 64
DETAILED_RANKS = 8
MAX_EVENTS_PER_RANK = 50_000
FINDINGS_PID = 1_000_000
TID_STEPS, TID_COLLECTIVES, TID_FINDINGS = 1, 2, 3
TID_STREAM_BASE = 1000
TID_HOST_BASE = 100


def build_timeline(analysis: Analysis, storage: Storage | None = None) -> bytes:
    """The gzipped Chrome-trace JSON of the analysis' window."""
    capture = analysis.capture
    ranks = sorted(capture.metas)
    if not ranks:
        return gzip.compress(json.dumps({"traceEvents": []}).encode())
    named = sorted({r for f in analysis.verdict.findings for r in f.ranks if r in capture.metas})
    shown = _shown_ranks(ranks, named)
    detailed = (named + [r for r in ranks if r not in named])[:DETAILED_RANKS]
    origin = min(capture.metas[r].window.step_bounds_ns[0][0] for r in shown)
    out: list[dict[str, Any]] = []
    for rank in shown:
        out.extend(_process(rank))
        out.extend(_steps(analysis, rank, origin))
    out.extend(_collectives(analysis, set(shown), origin))
    if storage is not None:
        for rank in detailed:
            out.extend(_raw_events(analysis, storage, rank, origin))
    out.extend(_findings(analysis, origin))
    doc = {
        "traceEvents": out,
        "displayTimeUnit": "ms",
        "otherData": {
            "producer": "perfdiag",
            "source": capture.source,
            "ranks_shown": len(shown),
            "ranks_total": len(ranks),
            "ranks_with_raw_events": detailed if storage is not None else [],
        },
    }
    return gzip.compress(json.dumps(doc, separators=(",", ":")).encode(), compresslevel=6)


def _shown_ranks(ranks: list[int], named: list[int]) -> list[int]:
    if len(ranks) <= MAX_RANKS:
        return ranks
    sample = np.linspace(0, len(ranks) - 1, MAX_RANKS - min(len(named), MAX_RANKS // 2))
    picked = {ranks[int(i)] for i in sample}
    return sorted(picked | set(named[: MAX_RANKS // 2]))


def _meta(pid: int, tid: int, name: str, value: Any) -> dict[str, Any]:
    key = "sort_index" if name.endswith("sort_index") else "name"
    return {"ph": "M", "pid": pid, "tid": tid, "name": name, "args": {key: value}}


def _process(rank: int) -> list[dict[str, Any]]:
    return [
        _meta(rank, 0, "process_name", f"rank {rank}"),
        _meta(rank, 0, "process_sort_index", rank),
        _meta(rank, TID_STEPS, "thread_name", "steps"),
        _meta(rank, TID_COLLECTIVES, "thread_name", "collectives (wait | transfer)"),
    ]


def _us(ns: float, origin: int) -> float:
    return round((ns - origin) / 1000.0, 3)


def _steps(analysis: Analysis, rank: int, origin: int) -> list[dict[str, Any]]:
    window = analysis.capture.metas[rank].window
    return [
        {
            "ph": "X",
            "cat": "step",
            "name": f"step {window.start_step + i}",
            "pid": rank,
            "tid": TID_STEPS,
            "ts": _us(start, origin),
            "dur": round((end - start) / 1000.0, 3),
        }
        for i, (start, end) in enumerate(window.step_bounds_ns)
    ]


def _collectives(analysis: Analysis, shown: set[int], origin: int) -> list[dict[str, Any]]:
    calls = analysis.capture.collectives
    result = analysis.collectives
    if calls is None or result is None:
        return []
    m = result.instances
    wait_of = np.zeros(calls.num_rows, dtype=np.int64)
    wait_of[m.row] = m.wait_ns
    keep = np.isin(calls["rank"].to_numpy(), sorted(shown))
    rows = np.flatnonzero(keep)
    table = calls.take(pa.array(rows))
    out: list[dict[str, Any]] = []
    for row, wait in zip(table.to_pylist(), wait_of[rows].tolist(), strict=True):
        rank, ts, dur = int(row["rank"]), int(row["ts_ns"]), int(row["dur_ns"])
        transfer = dur - wait
        name = f"{row['collective']} #{row['seq']}"
        args = {
            "process_group": row["pg_name"],
            "bytes": row["msg_bytes"],
            "wait_ms": round(wait / 1e6, 4),
            "transfer_ms": round(transfer / 1e6, 4),
        }
        if wait > 0:
            out.append(
                {"ph": "X", "cat": "collective_wait", "name": f"wait: {name}", "pid": rank,
                 "tid": TID_COLLECTIVES, "ts": _us(ts, origin), "dur": round(wait / 1000, 3),
                 "cname": "grey", "args": args}
            )  # fmt: skip
        out.append(
            {"ph": "X", "cat": "collective_transfer", "name": f"transfer: {name}", "pid": rank,
             "tid": TID_COLLECTIVES, "ts": _us(ts + wait, origin),
             "dur": round(transfer / 1000, 3), "args": args}
        )  # fmt: skip
    return out


def _raw_table(analysis: Analysis, storage: Storage, rank: int) -> pa.Table | None:
    capture = analysis.capture
    key = capture.trace_keys.get(rank)
    if key is not None:
        from perfdiag.kineto import TraceError, read_kineto

        with tempfile.TemporaryDirectory(prefix="perfdiag-timeline-") as tmp:
            path = storage.local_path(key)
            if path is None:
                path = Path(tmp) / "trace.json.gz"
                storage.get_file(key, path)
            try:
                events, _ = read_kineto(path, rank=rank)
            except TraceError:
                return None
        return events
    try:
        data = storage.get_bytes(layout.worker_key(rank, layout.EVENTS))
    except StorageNotFound:
        return None
    from perfdiag.parquet_io import table_from_bytes

    try:
        return table_from_bytes(data)
    except (pa.ArrowInvalid, OSError) as exc:
        note = f"ignored {storage.uri_of(layout.worker_key(rank, layout.EVENTS))}: {exc}"
        if note not in capture.input_notes:
            capture.input_notes.append(note)  # run_analysis adds it to the verdict's notes
        return None


def _raw_events(
    analysis: Analysis, storage: Storage, rank: int, origin: int
) -> list[dict[str, Any]]:
    events = _raw_table(analysis, storage, rank)
    if events is None or events.num_rows == 0:
        return []
    columns = ["name", "category", "ts_ns", "dur_ns", "tid", "stream"]
    events = events.select(columns)
    if events.num_rows > MAX_EVENTS_PER_RANK:
        # Keep the longest events: what shapes the picture at any zoom level.
        longest = pc.select_k_unstable(
            events, MAX_EVENTS_PER_RANK, sort_keys=[("dur_ns", "descending")]
        )
        events = events.take(longest)
    stream = events["stream"].to_numpy(zero_copy_only=False)
    host_tid = pc.fill_null(events["tid"], 0).to_numpy()
    host_ids = {int(t): i for i, t in enumerate(sorted(set(host_tid[np.isnan(stream)].tolist())))}
    out: list[dict[str, Any]] = []
    lanes: set[tuple[int, str]] = set()
    for row, s, t in zip(events.to_pylist(), stream.tolist(), host_tid.tolist(), strict=True):
        if s == s:  # a GPU stream (NaN on the host)
            tid = TID_STREAM_BASE + int(s)
            lanes.add((tid, f"GPU stream {int(s)}"))
        else:
            tid = TID_HOST_BASE + host_ids[int(t)]
            lanes.add((tid, f"thread {int(t)}"))
        out.append(
            {"ph": "X", "cat": row["category"], "name": row["name"], "pid": rank, "tid": tid,
             "ts": _us(row["ts_ns"], origin), "dur": round(row["dur_ns"] / 1000.0, 3)}
        )  # fmt: skip
    out.extend(_meta(rank, tid, "thread_name", name) for tid, name in sorted(lanes))
    return out


def _findings(analysis: Analysis, origin: int) -> list[dict[str, Any]]:
    metas = analysis.capture.metas
    out: list[dict[str, Any]] = [
        _meta(FINDINGS_PID, 0, "process_name", "findings"),
        _meta(FINDINGS_PID, 0, "process_sort_index", -1),
    ]
    for n, finding in enumerate(analysis.verdict.findings, start=1):
        label = f"#{n} {finding.kind}: {finding.category} (severity {finding.severity:.0%})"
        args = {
            "ranks": finding.ranks,
            "function": finding.function,
            "severity": finding.severity,
            "message": finding.message,
        }
        out.append(
            {"ph": "i", "s": "g", "cat": "finding", "name": label, "pid": FINDINGS_PID,
             "tid": 0, "ts": 0.0, "args": args}
        )  # fmt: skip
        for rank in finding.ranks:
            if rank not in metas:
                continue
            start, stop = metas[rank].window.span_ns
            out.append(_meta(rank, TID_FINDINGS, "thread_name", "findings"))
            out.append(
                {"ph": "X", "cat": "finding", "name": label, "pid": rank, "tid": TID_FINDINGS,
                 "ts": _us(start, origin), "dur": round((stop - start) / 1000.0, 3),
                 "cname": "terrible", "args": args}
            )  # fmt: skip
    return out
