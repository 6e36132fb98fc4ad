"""A parsed trace → the events table of one window (perfdiag.api.schema EVENTS_SCHEMA)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfdiag.api import taxonomy
from perfdiag.api.limits import MAX_STEP
from perfdiag.api.schema import EVENTS_SCHEMA
from perfdiag.engine.kineto.own_events import OWN_TIME_CAT, without_own_events
from perfdiag.engine.kineto.parse import RAW_SCHEMA, RawTrace, TraceError, dtype_bytes

_PROFILER_STEP = r"^ProfilerStep#(?P<n>\d+)$"


@dataclass(frozen=True)
class StepSpan:
    """One ProfilerStep#N range of a trace."""

    number: int
    start_ns: int
    end_ns: int


def profiler_steps(raw: RawTrace) -> list[StepSpan]:
    """The ProfilerStep#N ranges of the trace, by step number (one per number)."""
    events = raw.events
    names = taxonomy.distinct(events["name"])
    numbers = pc.struct_field(pc.extract_regex(names.values, _PROFILER_STEP), "n")
    per_name = np.asarray(pc.is_valid(numbers).to_numpy(zero_copy_only=False))
    rows = np.flatnonzero(names.mask(per_name))
    if not len(rows):
        return []
    try:
        per_number = pc.cast(numbers, pa.int64()).fill_null(0)
    except pa.ArrowInvalid:  # more digits than an int64 holds
        per_number = None
    if per_number is None or pc.max(per_number).as_py() > MAX_STEP:
        raise TraceError(
            f"{raw.path}: a ProfilerStep#N number is above the limit of {MAX_STEP} (docs/limits.md)"
        )
    number = np.asarray(per_number.to_numpy())[names.codes[rows]]
    start = events["ts_ns"].to_numpy()[rows]
    end = start + events["dur_ns"].to_numpy()[rows]
    # A few ranges: numpy, not Arrow's group_by, whose first call imports pyarrow.acero and
    # pyarrow.dataset (~50 ms of a fresh `perfdiag analyze`).
    numbers, which = np.unique(number, return_inverse=True)
    first = np.full(len(numbers), np.iinfo(np.int64).max, dtype=np.int64)
    last = np.full(len(numbers), np.iinfo(np.int64).min, dtype=np.int64)
    np.minimum.at(first, which, start)
    np.maximum.at(last, which, end)
    return [
        StepSpan(int(n), int(s), int(e))
        for n, s, e in zip(numbers.tolist(), first.tolist(), last.tolist(), strict=True)
    ]


def step_bounds(path: Path, steps: list[StepSpan]) -> list[tuple[int, int]]:
    """[start, end) of each step on the trace clock. A step ends where the next one (by number)
    starts, so the profiler's own work between steps belongs to the step it closes."""
    bounds: list[tuple[int, int]] = []
    for i, step in enumerate(steps):
        end = step.end_ns
        if i + 1 < len(steps) and steps[i + 1].number == step.number + 1:
            end = steps[i + 1].start_ns
        if end <= step.start_ns or (bounds and step.start_ns < bounds[-1][1]):
            raise TraceError(
                f"{path}: ProfilerStep#{step.number} overlaps the step before it or ends before "
                "it starts (the step ranges are not in time order)"
            )
        bounds.append((step.start_ns, end))
    return bounds


def trace_span(raw: RawTrace) -> tuple[int, int]:
    """[first start, last end) of the trace's events (its whole time as one step)."""
    events = raw.events.filter(pc.is_valid(raw.events["pid"]))
    if events.num_rows == 0:
        raise TraceError(f"{raw.path}: the trace holds no complete ('X') events")
    start = pc.min(events["ts_ns"]).as_py()
    end = pc.max(pc.add(events["ts_ns"], events["dur_ns"])).as_py()
    return int(start), int(max(end, start + 1))


def rank_from_name(path: Path) -> int | None:
    match = re.search(r"(?:^|[^a-z0-9])rank[-_]?(\d+)", path.name, re.IGNORECASE | re.ASCII)
    return int(match.group(1)) if match else None


def distributed_info(header: dict[str, Any]) -> dict[str, Any]:
    info = header.get("distributedInfo")
    return info if isinstance(info, dict) else {}


def build_events(
    raw: RawTrace,
    rank: int,
    bounds: list[tuple[int, int]],
    *,
    extra: pa.Table | None = None,
) -> pa.Table:
    """The events table of the window `bounds` (EVENTS_SCHEMA, without metadata).

    Keeps the events that overlap the window (an event running into it matters to the critical
    path); `step` is the window step containing the event's start, -1 outside. `extra` holds
    more events in RAW_SCHEMA (the hook's GC records). perfdiag's own activity is left out
    (perfdiag.engine.kineto.own_events)."""
    events = raw.events
    if extra is not None and extra.num_rows:
        events = pa.concat_tables([events, extra.cast(RAW_SCHEMA)])
    events, own = without_own_events(events)
    # Bookkeeping events carry a label as pid ("Spans", "Traces"): not activity of the worker.
    valid = pc.and_(pc.is_valid(events["pid"]), pc.is_valid(events["tid"]))
    events = events.append_column("seq", _collective_sequence(events, valid))
    w0, w1 = bounds[0][0], bounds[-1][1]
    ts = events["ts_ns"]
    end = pc.add(ts, events["dur_ns"])
    inside = pc.and_(pc.less(ts, w1), pc.or_(pc.greater(end, w0), pc.greater_equal(ts, w0)))
    kept = pc.and_(valid, inside)
    if own.any():
        kept = pc.and_(kept, pa.array(~own))
    events = events.filter(kept)  # one filter: one copy of the names

    cat = taxonomy.distinct(events["cat"])
    name = taxonomy.distinct(events["name"])
    category = _own_time_idle_class(cat, taxonomy.categorize(cat, name))
    on_device = pa.array(taxonomy.is_device(cat))
    null_int = pa.scalar(None, pa.int64())
    device = pc.if_else(on_device, pc.coalesce(events["arg_device"], events["pid"]), null_int)
    stream = pc.if_else(on_device, pc.coalesce(events["arg_stream"], events["tid"]), null_int)
    is_comm = pc.equal(category, "communication")
    collective = _collectives(events, name, is_comm)
    built = pa.table(
        {
            "rank": pa.array(np.full(events.num_rows, rank, dtype=np.int32)),
            "name": events["name"],
            "category": category,
            "kineto_cat": pc.fill_null(events["cat"], ""),
            "ts_ns": events["ts_ns"],
            "dur_ns": events["dur_ns"],
            "pid": events["pid"],
            "tid": events["tid"],
            "device": pc.cast(device, pa.int32()),
            "stream": stream,
            "step": pa.array(step_of(events["ts_ns"], bounds)),
            "correlation": events["correlation"],
            "collective": collective,
            "msg_bytes": pc.if_else(is_comm, _message_bytes(events), null_int),
            "group_size": pc.cast(pc.if_else(is_comm, events["group_size"], null_int), pa.int32()),
            "pg_name": pc.if_else(is_comm, events["pg_name"], pa.scalar(None, pa.string())),
            "seq": events["seq"],
            "dtype": pc.if_else(is_comm, events["dtype"], pa.scalar(None, pa.string())),
            "pg_ranks": pc.if_else(is_comm, events["pg_ranks"], pa.scalar(None, pa.string())),
            "out_msg_bytes": pc.if_else(is_comm, _message_bytes(events, "out_nelems"), null_int),
        },
        schema=EVENTS_SCHEMA,
    )
    taxonomy.keep_answers_for(built)  # the raw trace's columns can go
    return built


def _own_time_idle_class(cat: taxonomy.Distinct, category: pa.Array) -> pa.Array:
    """perfdiag's own time (own_events) ranks lowest on the critical path, with Python frames
    and user ranges' self time ("annotation"): where it wins, the summary counts it as idle."""
    own = cat.mask(np.array([c == OWN_TIME_CAT for c in cat.values.to_pylist()], dtype=bool))
    if not own.any():
        return category
    return pc.if_else(pa.array(own), pa.scalar("annotation"), category)


def _collectives(events: pa.Table, name: taxonomy.Distinct, is_comm: pa.Array) -> pa.Array:
    """Collective names of the communication events (the others null)."""
    rows = np.flatnonzero(np.asarray(is_comm.to_numpy(zero_copy_only=False)))
    out = pa.nulls(events.num_rows, pa.string())
    if not len(rows):
        return out
    taken = pa.array(rows)
    names = taxonomy.Distinct(name.values, name.codes[rows])
    found = taxonomy.collective_names(names, events["collective"].take(taken))
    index = np.full(events.num_rows, -1, dtype=np.int64)
    index[rows] = np.arange(len(rows))
    return found.take(pa.array(index, mask=index < 0))


def step_of(
    ts_ns: pa.ChunkedArray | pa.Array, bounds: list[tuple[int, int]]
) -> np.ndarray[Any, np.dtype[np.int32]]:
    """Index of the window step containing each timestamp, -1 outside the steps."""
    ts = np.asarray(ts_ns.to_numpy())
    starts = np.array([b[0] for b in bounds], dtype=np.int64)
    ends = np.array([b[1] for b in bounds], dtype=np.int64)
    idx = np.searchsorted(starts, ts, side="right") - 1
    clipped = np.clip(idx, 0, len(bounds) - 1)
    inside = (idx >= 0) & (ts < ends[clipped])
    return np.where(inside, idx, -1).astype(np.int32)


def _message_bytes(events: pa.Table, elements: str = "in_nelems") -> pa.ChunkedArray | pa.Array:
    """Message elements × element size (record_param_comms / NCCL kernel args; `elements` is
    in_nelems or out_nelems), else for the input the size of a gloo annotation's input."""
    dtypes, idx = taxonomy.distinct(events["dtype"])
    sizes = np.array([dtype_bytes(d) or 0 for d in dtypes.to_pylist()], dtype=np.int64)
    size = sizes[idx] if len(idx) else np.zeros(0, dtype=np.int64)
    size_arr = pa.array(size, mask=size == 0)
    from_args = pc.multiply(events[elements], size_arr)
    if elements != "in_nelems":
        return from_args
    return pc.coalesce(from_args, events["input_bytes"])


def _collective_sequence(events: pa.Table, counted: pa.ChunkedArray | pa.Array) -> pa.Array:
    """Sequence number of each collective call within its process group on this worker:
    the order of record_param_comms ops, NCCL kernels and gloo annotations, counted separately
    per kind and group over the whole trace (so that windows starting at the same step agree
    across ranks) — or Kineto's `Seq` argument where the trace has it. Only the `counted` rows
    are numbered."""
    names, name_idx = taxonomy.distinct(events["name"])
    n = events.num_rows
    if n == 0:
        return pa.array([], pa.int64())
    kinds_per_name = pc.extract_regex(
        names, r"^(?P<kind>record_param_comms$|ncclDevKernel|ncclKernel|gloo:)"
    )
    kind_names = pc.struct_field(kinds_per_name, "kind").to_pylist()
    kind_code = np.array(
        [{"record_param_comms": 1, "gloo:": 3}.get(k or "", 2 if k else 0) for k in kind_names]
    )
    kind = np.where(
        np.asarray(pc.fill_null(counted, False).to_numpy(zero_copy_only=False)),
        kind_code[name_idx],
        0,
    )
    calls = np.flatnonzero(kind > 0)
    seq = np.full(n, -1, dtype=np.int64)
    if len(calls):
        groups, group_idx = taxonomy.distinct(events["pg_name"])
        key = kind[calls] * (len(groups) + 1) + group_idx[calls]
        ts = events["ts_ns"].to_numpy()[calls]
        order = np.lexsort((ts, key))
        sorted_key = key[order]
        first = np.r_[True, sorted_key[1:] != sorted_key[:-1]]
        start = np.maximum.accumulate(np.where(first, np.arange(len(order)), 0))
        seq[calls[order]] = np.arange(len(order)) - start
    # Where Kineto wrote the process group's own sequence number, it is the one to match on.
    given = pc.if_else(pc.fill_null(counted, False), events["seq_arg"], pa.scalar(None, pa.int64()))
    return pc.coalesce(given, pa.array(seq, mask=seq < 0))
