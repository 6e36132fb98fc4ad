"""timeline.json.gz: the analysed window as one Chrome-trace / Perfetto file, ranks merged.

Layout (open it in https://ui.perfetto.dev or chrome://tracing):
  * one process per rank (pid = rank, "rank N", sorted by rank) with
      - tid 1 "steps": the window's steps;
      - tid 2 "collectives (wait | transfer)": each matched collective call split into the part
        spent waiting for the last rank and the transfer (analyzer/compare/collectives.py);
      - for a few ranks (those named in findings, then their lowest-numbered peers): the raw
        events, host threads and GPU streams (tid 1000 + stream), from what the import of the
        rank's trace kept (Kineto folders: no trace is read twice) or events.parquet (captures
        that kept raw events);
      - tid 3 "findings": one span over the window per finding naming the rank;
  * a "findings" process (pid FINDINGS_PID) with one instant event per finding.
Timestamps are µs from the earliest window start on the trace clocks (Kineto writes the host
clock, so ranks line up as well as the hosts' clocks agree). Above MAX_RANKS ranks only the
ranks named in findings and an even sample are included; detailed events are capped per rank.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc
from isal import isal_zlib

from perfdiag.analyzer.load.timeline_events import timeline_events
from perfdiag.analyzer.report.analysis import Analysis
from perfdiag.analyzer.report.verdict import listed_findings
from perfdiag.engine.allocator import release_memory, system_allocator
from perfdiag.storage import Storage, StorageNotFound, layout

MAX_RANKS = 64
DETAILED_RANKS = 8
FINDINGS_PID = 1_000_000
TID_STEPS, TID_COLLECTIVES, TID_FINDINGS = 1, 2, 3
TID_STREAM_BASE = 1000
ROWS_AT_ONCE = 8192  # raw events formatted at a time
TID_HOST_BASE = 100


def build_timeline(analysis: Analysis, storage: Storage | None = None) -> bytes:
    """The gzipped Chrome-trace JSON of the analysis' window."""
    capture = analysis.capture
    ranks = sorted(capture.metas)
    if not ranks:
        return gzip.compress(json.dumps({"traceEvents": []}).encode())
    named = sorted(
        {r for f in listed_findings(analysis.reported) for r in f.ranks if r in capture.metas}
    )
    shown = _shown_ranks(ranks, named)
    detailed = (named + [r for r in ranks if r not in named])[:DETAILED_RANKS]
    origin = min(capture.metas[r].window.step_bounds_ns[0][0] for r in shown)
    out: list[dict[str, Any]] = []
    for rank in shown:
        out.extend(_process(rank))
        out.extend(_steps(analysis, rank, origin))
    doc = {
        "traceEvents": [],
        "displayTimeUnit": "ms",
        "otherData": {
            "producer": "perfdiag",
            "source": capture.source,
            "ranks_shown": len(shown),
            "ranks_total": len(ranks),
            "ranks_with_raw_events": detailed if storage is not None else [],
        },
    }
    head, tail = json.dumps(doc, separators=(",", ":")).split('"traceEvents":[]', 1)
    # Written as it is made, into the compressor: the JSON text (15 MB for two 35 MB traces)
    # is never held whole. The raw events (most of it) and the collective calls are formatted
    # column by column, the rest by json.dumps; the parts are items of the one list of
    # traceEvents (`out` is never empty: each shown rank has its process' names).
    # ISA-L's level 2: a tenth of zlib's level 6's time, a third larger (1.1 vs 0.84 MB for two
    # 35 MB traces): the file is written on every analysis and opened now and then.
    deflate = isal_zlib.compressobj(2, isal_zlib.DEFLATED, 31)  # 31: the gzip format
    chunks: list[bytes] = []

    def write(text: str | memoryview) -> None:
        chunks.append(deflate.compress(text.encode() if isinstance(text, str) else text))

    write(f'{head}"traceEvents":[{_json_items(out)}')
    _collectives(analysis, set(shown), origin, write)
    if storage is not None:
        # The C library's allocator, trimmed after each rank (as while the traces were read):
        # Arrow's default pool kept ~20 MB more resident over two ranks.
        with system_allocator():
            for rank in detailed:
                _raw_events(analysis, storage, rank, origin, write)
                release_memory()  # one rank's columns at a time
    write(f",{_json_items(_findings(analysis, origin))}]{tail}")
    chunks.append(deflate.flush())
    return b"".join(chunks)


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


def _collectives(
    analysis: Analysis, shown: set[int], origin: int, write: Callable[[str | memoryview], None]
) -> None:
    """Write each collective call of the shown ranks as Chrome-trace JSON objects, each after a
    comma: its wait for the last rank (where it waited) and its transfer, formatted column by
    column (a long window holds thousands of calls a rank) as `json.dumps` writes them, the
    milliseconds in `args` to 4 decimals."""
    calls = analysis.capture.collectives
    result = analysis.collectives
    if calls is None or result is None:
        return
    m = result.instances
    wait_of = np.zeros(calls.num_rows, dtype=np.int64)
    wait_of[m.row] = m.wait_ns
    rows = np.flatnonzero(np.isin(calls["rank"].to_numpy(), sorted(shown)))
    if not len(rows):
        return
    table = calls.take(pa.array(rows))
    wait = wait_of[rows]
    ts = _column_ints(table["ts_ns"]) - origin
    transfer = _column_ints(table["dur_ns"]) - wait
    seq = pc.fill_null(pc.cast(table["seq"].combine_chunks(), pa.string()), "None")
    name = pc.binary_join_element_wise(_json_text(table["collective"]), " #", seq, "")
    args = pc.binary_join_element_wise(
        '{"process_group":',
        _decoded(_json_strings(table["pg_name"])),
        ',"bytes":',
        pc.fill_null(pc.cast(table["msg_bytes"].combine_chunks(), pa.string()), "null"),
        ',"wait_ms":',
        _json_ms(wait),
        ',"transfer_ms":',
        _json_ms(transfer),
        "}",
        "",
    )
    lane = f',"tid":{TID_COLLECTIVES},"ts":'
    pid = pc.cast(table["rank"].combine_chunks(), pa.string())
    waited = np.flatnonzero(wait > 0)
    waits = pc.binary_join_element_wise(
        ',{"ph":"X","cat":"collective_wait","name":"wait: ',
        name.take(pa.array(waited)),
        '","pid":',
        pid.take(pa.array(waited)),
        lane,
        _json_us(ts[waited]),
        ',"dur":',
        _json_us(wait[waited]),
        ',"cname":"grey","args":',
        args.take(pa.array(waited)),
        "}",
        "",
    )
    transfers = pc.binary_join_element_wise(
        ',{"ph":"X","cat":"collective_transfer","name":"transfer: ',
        name,
        '","pid":',
        pid,
        lane,
        _json_us(ts + wait),
        ',"dur":',
        _json_us(transfer),
        ',"args":',
        args,
        "}",
        "",
    )
    # Each call's wait, where it waited, then its transfer.
    position = np.arange(len(rows)) + np.cumsum(wait > 0)  # the transfer's place
    order = np.empty(len(rows) + len(waited), dtype=np.int64)
    order[position] = len(waited) + np.arange(len(rows))
    order[position[waited] - 1] = np.arange(len(waited))
    _write_texts(pa.concat_arrays([waits, transfers]).take(pa.array(order)), write)


def _raw_table(analysis: Analysis, storage: Storage, rank: int) -> pa.Table | None:
    capture = analysis.capture
    kept = capture.timeline_events.get(rank)
    if kept is not None:
        with pa.memory_map(str(kept)) as source:
            return pa.ipc.open_file(source).read_all()
    if capture.kind != "capture" or not capture.may_have_events(rank):
        return None  # a Kineto trace the import kept nothing of, or raw events not kept
    try:
        data = storage.get_bytes(layout.worker_key(rank, layout.EVENTS))
    except StorageNotFound:
        return None
    # Imported here: the timeline of a folder of Kineto traces never loads pyarrow.parquet.
    from perfdiag.engine.parquet_io import table_from_bytes

    try:
        return timeline_events(table_from_bytes(data))
    except (pa.ArrowInvalid, OSError, KeyError) as exc:
        note = f"ignored {storage.uri_of(layout.worker_key(rank, layout.EVENTS))}: {exc}"
        analysis.notes.add_input(note)  # the verdict, built after the timeline, says it
        return None


def _raw_events(
    analysis: Analysis,
    storage: Storage,
    rank: int,
    origin: int,
    write: Callable[[str | memoryview], None],
) -> None:
    """Write the rank's raw events as Chrome-trace JSON objects, each after a comma (nothing
    when it has none), formatted column by column: the text `json.dumps` writes for each
    event's dict."""
    events = _raw_table(analysis, storage, rank)
    if events is None or events.num_rows == 0:
        return
    stream = events["stream"].to_numpy(zero_copy_only=False)
    host_tid = pc.fill_null(events["tid"], 0).to_numpy()
    on_gpu = ~np.isnan(stream)  # NaN on the host
    host_ids = sorted(set(host_tid[~on_gpu].tolist()))
    tid = np.empty(events.num_rows, dtype=np.int64)
    tid[on_gpu] = TID_STREAM_BASE + stream[on_gpu].astype(np.int64)
    tid[~on_gpu] = TID_HOST_BASE + np.searchsorted(host_ids, host_tid[~on_gpu])
    lanes = {(TID_STREAM_BASE + int(s), f"GPU stream {int(s)}") for s in set(stream[on_gpu])}
    lanes |= {(TID_HOST_BASE + i, f"thread {int(t)}") for i, t in enumerate(host_ids)}
    ts_ns, dur_ns = _column_ints(events["ts_ns"]), _column_ints(events["dur_ns"])
    categories, names = _json_strings(events["category"]), _json_strings(events["name"])
    # A slice of rows at a time: each of the texts below is as long as the rows it formats
    # (~150 bytes a GPU kernel's event), and several are alive at once.
    for start in range(0, events.num_rows, ROWS_AT_ONCE):
        rows = slice(start, start + ROWS_AT_ONCE)
        objects = pc.binary_join_element_wise(
            ',{"ph":"X","cat":',
            _decoded(categories.slice(start, ROWS_AT_ONCE)),
            ',"name":',
            _decoded(names.slice(start, ROWS_AT_ONCE)),
            f',"pid":{rank},"tid":',
            pa.array(tid[rows]).cast(pa.string()),
            ',"ts":',
            _json_us(ts_ns[rows] - origin),
            ',"dur":',
            _json_us(dur_ns[rows]),
            "}",
            "",
        )
        _write_texts(objects, write)
    lane_names = [_meta(rank, t, "thread_name", name) for t, name in sorted(lanes)]
    write(f",{_json_items(lane_names)}")


def _write_texts(texts: pa.Array, write: Callable[[str | memoryview], None]) -> None:
    """The texts one after another, straight from their Arrow buffer."""
    if not len(texts):
        return
    offsets = np.frombuffer(texts.buffers()[1], dtype=np.int32)[: len(texts) + 1]
    data = texts.buffers()[2]
    assert data is not None and texts.offset == 0 and texts.null_count == 0
    write(memoryview(data)[int(offsets[0]) : int(offsets[-1])])


def _column_ints(values: pa.ChunkedArray) -> np.ndarray:
    return np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.int64)


def _json_text(values: pa.ChunkedArray) -> pa.Array:
    """Each value as `json.dumps(str(value))` writes it, without the quotes (null: None)."""
    encoded = pc.dictionary_encode(values.combine_chunks(), null_encoding="encode")
    texts = [json.dumps(str(v))[1:-1] for v in encoded.dictionary.to_pylist()]
    return pa.array(texts, pa.string()).take(encoded.indices)


def _json_strings(values: pa.ChunkedArray) -> pa.DictionaryArray:
    """Each string as json.dumps writes it (null: null), each distinct one encoded once: a
    dictionary array of the JSON texts (`_decoded` gives a slice of it as text)."""
    encoded = pc.dictionary_encode(values.combine_chunks())
    if pa.types.is_dictionary(values.type):  # already encoded: the dictionary of the dictionary
        encoded = pc.dictionary_encode(encoded.cast(values.type.value_type))
    texts = pa.array([json.dumps(v) for v in encoded.dictionary.to_pylist()], pa.string())
    return pa.DictionaryArray.from_arrays(encoded.indices, texts)


def _decoded(texts: pa.DictionaryArray) -> pa.Array:
    return pc.fill_null(texts.dictionary_decode(), "null")


def _json_us(ns: np.ndarray) -> pa.Array:
    """Nanoseconds as `round(ns / 1000.0, 3)` prints (repr of a float with at most three
    decimals, whose magnitude stays far below repr's switch to exponents), from integers."""
    return _json_decimal(ns, 3)


def _json_ms(ns: np.ndarray) -> pa.Array:
    """Nanoseconds as milliseconds to 4 decimals, rounded half to even at 100 ns: as
    `round(ns / 1e6, 4)` prints them, but for an exact half, which that rounds as the nearest
    binary double falls."""
    units, rest = np.divmod(np.abs(ns), 100)
    units = units + ((rest > 50) | ((rest == 50) & (units % 2 == 1)))
    return _json_decimal(np.where(ns < 0, -units, units), 4)


def _json_decimal(units: np.ndarray, digits: int) -> pa.Array:
    """Integers of 10^-digits as repr() writes such a float: the decimals without their
    trailing zeros, ".0" for none, a minus sign only where not zero."""
    scale = 10**digits
    magnitude = np.abs(units)
    whole = pa.array(magnitude // scale).cast(pa.string())
    decimals = pa.array(magnitude % scale).cast(pa.string())
    decimals = pc.utf8_rtrim(pc.utf8_lpad(decimals, digits, "0"), "0")
    decimals = pc.if_else(pc.equal(decimals, ""), "0", decimals)
    sign = pa.array(np.where(units < 0, "-", ""), pa.string())
    return pc.binary_join_element_wise(sign, whole, ".", decimals, "")


def _json_items(events: list[dict[str, Any]]) -> str:
    """The events as the items of a JSON list (json.dumps, compact), without the brackets."""
    return json.dumps(events, separators=(",", ":"))[1:-1]


def _findings(analysis: Analysis, origin: int) -> list[dict[str, Any]]:
    metas = analysis.capture.metas
    out: list[dict[str, Any]] = [
        _meta(FINDINGS_PID, 0, "process_name", "findings"),
        _meta(FINDINGS_PID, 0, "process_sort_index", -1),
    ]
    for n, finding in enumerate(listed_findings(analysis.reported), start=1):
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
