"""A parsed trace → the events table of one window (perfdiag.api.schema EVENTS_SCHEMA)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from perfdiag.api import taxonomy
from perfdiag.api.limits import MAX_STEP
from perfdiag.api.schema import EVENTS_SCHEMA
from perfdiag.api.taxonomy import COMMUNICATION
from perfdiag.engine.kineto.own_events import OWN_TIME_CAT, OWN_TIME_NAME, own_events
from perfdiag.engine.kineto.parse import RAW_SCHEMA, RawTrace, TraceError, dtype_bytes, spread

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
    labelled = _valid(raw.events["pid"])  # the two columns read, not the whole table
    if not labelled.any():
        raise TraceError(f"{raw.path}: the trace holds no complete ('X') events")
    ts = _ints(raw.events["ts_ns"])[labelled]
    start = int(ts.min())
    end = int((ts + _ints(raw.events["dur_ns"])[labelled]).max())
    return start, max(end, start + 1)


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
    own = own_events(events)
    # Bookkeeping events carry a label as pid ("Spans", "Traces"): not activity of the worker.
    valid = _valid(events["pid"]) & _valid(events["tid"])
    seq = _collective_sequence(events, valid)
    ts = _ints(events["ts_ns"])
    end = ts + _ints(events["dur_ns"])
    w0, w1 = bounds[0][0], bounds[-1][1]
    kept = valid & (ts < w1) & ((end > w0) | (ts >= w0))
    # Each row of the table is a row of `events` (numpy and Arrow take the columns needed, no
    # filter of the whole raw table): the kept ones in order, then the copies that hold
    # perfdiag's own time (its hook's frames, renamed).
    base = np.flatnonzero(kept & ~own.drop)
    held = own.holders[kept[own.holders]]
    rows = np.concatenate([base, held])
    taken, from_base = pa.array(rows), pa.array(base)
    own_rows = len(held)

    cat = taxonomy.distinct(events["cat"])
    name = taxonomy.distinct(events["name"])
    base_cat = taxonomy.Distinct(cat.values, cat.codes[base])
    category, is_comm = _categories(
        base_cat, taxonomy.Distinct(name.values, name.codes[base]), own_rows
    )
    on_device = np.r_[taxonomy.is_device(base_cat), np.zeros(own_rows, dtype=bool)]
    pid, tid = events["pid"].take(taken), events["tid"].take(taken)
    # The communication events (base rows only: perfdiag's own are annotations).
    comm = np.flatnonzero(is_comm)
    calls = events.select(_CALL_COLUMNS).take(pa.array(rows[comm]))
    comm_name = _used(taxonomy.Distinct(name.values, name.codes[rows[comm]]))
    n = len(rows)

    def at_calls(values: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
        return spread(values, comm, n)

    built = pa.table(
        {
            "rank": pa.array(np.full(n, rank, dtype=np.int32)),
            "name": _strings_at(events["name"], name, base, OWN_TIME_NAME, own_rows),
            "category": category,
            "kineto_cat": pc.fill_null(
                _strings_at(events["cat"], cat, base, OWN_TIME_CAT, own_rows), ""
            ),
            "ts_ns": pa.array(ts[rows]),
            "dur_ns": events["dur_ns"].take(taken),
            "pid": pid,
            "tid": tid,
            "device": pc.cast(
                _on_device(on_device, events["arg_device"].take(taken), pid), pa.int32()
            ),
            "stream": _on_device(on_device, events["arg_stream"].take(taken), tid),
            "step": pa.array(step_of(ts[rows], bounds)),
            "correlation": events["correlation"].take(taken),
            "collective": at_calls(taxonomy.collective_names(comm_name, calls["collective"])),
            "msg_bytes": at_calls(_message_bytes(calls)),
            "group_size": at_calls(pc.cast(calls["group_size"], pa.int32())),
            "pg_name": at_calls(calls["pg_name"]),
            "seq": _with_own(seq.take(from_base), None, own_rows),
            "dtype": at_calls(calls["dtype"]),
            "pg_ranks": at_calls(calls["pg_ranks"]),
            "out_msg_bytes": at_calls(_message_bytes(calls, "out_nelems")),
        },
        schema=EVENTS_SCHEMA,
    )
    taxonomy.keep_answers_for(built)  # the raw trace's columns can go
    return built


# What the communication events need of the raw columns.
_CALL_COLUMNS = [
    "collective",
    "in_nelems",
    "out_nelems",
    "group_size",
    "dtype",
    "pg_name",
    "pg_ranks",
    "input_bytes",
]


def _valid(column: pa.ChunkedArray | pa.Array) -> npt.NDArray[np.bool_]:
    return np.asarray(pc.is_valid(column).to_numpy(zero_copy_only=False), dtype=bool)


def _ints(column: pa.ChunkedArray | pa.Array) -> npt.NDArray[np.int64]:
    """A column without nulls as int64 (no copy of a single chunk)."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return np.asarray(array.to_numpy(zero_copy_only=False), dtype=np.int64)


def _categories(
    cat: taxonomy.Distinct, name: taxonomy.Distinct, own_rows: int
) -> tuple[pa.Array | pa.ChunkedArray, npt.NDArray[np.bool_]]:
    """The category of each (cat, name) row, then "annotation" for the `own_rows` rows that
    hold perfdiag's own time; and which rows are communication. The taxonomy's rules are run
    on the distinct (cat, name) pairs and spread to the rows: its masks are per row of what it
    is given."""
    n_names = max(len(name.values), 1)
    pairs = cat.codes * n_names + name.codes
    space = len(cat.values) * n_names
    if len(pairs) and space <= 4 * len(pairs) + (1 << 20):  # counted in place, no sort
        present = np.bincount(pairs, minlength=space) > 0
        distinct = np.flatnonzero(present)
        pair_cat = taxonomy.Distinct(cat.values, distinct // n_names)
        per_pair = _own_time_idle_class(
            pair_cat,
            taxonomy.categorize(pair_cat, taxonomy.Distinct(name.values, distinct % n_names)),
        )
        of_row = (np.cumsum(present) - 1)[pairs]
        category = _decoded(taxonomy.Distinct(per_pair, of_row), "annotation", own_rows)
        comm = _is(per_pair, COMMUNICATION)[of_row]
    else:
        per_row = _own_time_idle_class(cat, taxonomy.categorize(cat, name))
        category = _with_own(per_row, "annotation", own_rows)
        comm = _is(per_row, COMMUNICATION)
    return category, np.r_[comm, np.zeros(own_rows, bool)]


def _is(values: pa.Array, value: str) -> npt.NDArray[np.bool_]:
    return np.asarray(pc.equal(values, value).to_numpy(zero_copy_only=False), dtype=bool)


def _used(column: taxonomy.Distinct) -> taxonomy.Distinct:
    """The same rows over the values they use only (the taxonomy's name rules run per value:
    a few communication events need not pay for every name of the trace)."""
    used, codes = np.unique(column.codes, return_inverse=True)
    return taxonomy.Distinct(column.values.take(pa.array(used)), codes.astype(np.int64))


def _strings_at(
    column: pa.ChunkedArray | pa.Array,
    distinct: taxonomy.Distinct,
    rows: npt.NDArray[np.int64],
    own_value: str,
    own_rows: int,
) -> pa.Array | pa.ChunkedArray:
    """`column` at `rows`, then `own_rows` times `own_value`. Where the column has no nulls
    (`distinct` reads a null as ""), decoded from its distinct values."""
    if column.null_count:
        return _with_own(column.take(pa.array(rows)), own_value, own_rows)
    return _decoded(taxonomy.Distinct(distinct.values, distinct.codes[rows]), own_value, own_rows)


def _decoded(column: taxonomy.Distinct, own_value: str, own_rows: int) -> pa.Array:
    """The column's values, then `own_rows` times `own_value`, as one array: the text copied
    once, from the few distinct values (not read again from the whole raw column), and in one
    chunk, which its readers need not join."""
    values, codes = column.values, column.codes
    if own_rows:
        codes = np.concatenate([codes, np.full(own_rows, len(values), dtype=np.int64)])
        values = pa.concat_arrays([values, pa.array([own_value], values.type)])
    return values.take(pa.array(codes))


def _with_own(
    values: pa.Array | pa.ChunkedArray, value: str | None, own_rows: int
) -> pa.Array | pa.ChunkedArray:
    """`values`, then `own_rows` times `value` (None: nulls)."""
    if not own_rows:
        return values
    tail = pa.array([value] * own_rows, values.type)
    chunks = values.chunks if isinstance(values, pa.ChunkedArray) else [values]
    return pa.chunked_array([*chunks, tail], values.type)


def _on_device(
    on_device: npt.NDArray[np.bool_],
    argument: pa.ChunkedArray | pa.Array,
    fallback: pa.ChunkedArray | pa.Array,
) -> pa.ChunkedArray | pa.Array:
    """The device (or stream) argument of device events, else their pid (tid); null on host."""
    return pc.if_else(
        pa.array(on_device), pc.coalesce(argument, fallback), pa.scalar(None, pa.int64())
    )


def _own_time_idle_class(cat: taxonomy.Distinct, category: pa.Array) -> pa.Array:
    """perfdiag's own time (own_events) ranks lowest on the critical path, with Python frames
    and user ranges' self time ("annotation"): where it wins, the summary counts it as idle."""
    own = cat.mask(np.array([c == OWN_TIME_CAT for c in cat.values.to_pylist()], dtype=bool))
    if not own.any():
        return category
    return pc.if_else(pa.array(own), pa.scalar("annotation"), category)


def step_of(
    ts: npt.NDArray[np.int64], bounds: list[tuple[int, int]]
) -> np.ndarray[Any, np.dtype[np.int32]]:
    """Index of the window step containing each timestamp, -1 outside the steps."""
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


def _collective_sequence(events: pa.Table, counted: npt.NDArray[np.bool_]) -> pa.Array:
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
    calls = np.flatnonzero(counted & (kind_code[name_idx] > 0))
    seq = np.full(n, -1, dtype=np.int64)
    if len(calls):
        taken = pa.array(calls)
        # The calls' groups (numbered among the calls only: the number only groups them).
        groups, group_idx = taxonomy.distinct(events["pg_name"].take(taken))
        kind = kind_code[name_idx[calls]]
        key = kind * (len(groups) + 1) + group_idx
        ts = _ints(events["ts_ns"])[calls]
        order = np.lexsort((ts, key))
        sorted_key = key[order]
        first = np.r_[True, sorted_key[1:] != sorted_key[:-1]]
        start = np.maximum.accumulate(np.where(first, np.arange(len(order)), 0))
        seq[calls[order]] = np.arange(len(order)) - start
        # Where Kineto wrote the process group's own sequence number, it is the one to match on.
        numbered = pa.array(seq, mask=seq < 0)
        if events["seq_arg"].null_count == n:  # no trace but recent torch's writes it
            return numbered
        given = spread(events["seq_arg"].take(taken), calls, n)
        return pc.coalesce(given, numbered)
    return pa.nulls(n, pa.int64())
