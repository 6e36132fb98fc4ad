"""Kineto Chrome-trace JSON(.gz) → one Arrow table of its complete ('X') events.

Two readers give the same table (perfdiag.engine.kineto.fast_reader, .general_reader): the fast one
for the files Kineto writes, the general one for anything else that is valid JSON, and for
wording the error when it is not. The arguments of collectives (record_param_comms, NCCL
kernels, gloo/nccl annotations) are decoded for those few events alone.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from perfdiag.api import taxonomy
from perfdiag.engine.allocator import system_allocator
from perfdiag.engine.kineto import native
from perfdiag.engine.kineto.fast_reader import FastRead, read_stream
from perfdiag.engine.kineto.general_reader import integer_arg, read_general, text_arg
from perfdiag.engine.kineto.json_shape import TraceError
from perfdiag.engine.kineto.text import PIECE, read_text

__all__ = [
    "COMM_CALL_PREFIXES",
    "RAW_SCHEMA",
    "RawTrace",
    "TraceError",
    "dtype_bytes",
    "load_trace",
    "raw_trace",
    "spread",
]

# Arguments of collectives: (args key, column, type).
_COMM_ARGS: list[tuple[str, str, pa.DataType]] = [
    ("Collective name", "collective", pa.string()),
    ("In msg nelems", "in_nelems", pa.int64()),
    ("Out msg nelems", "out_nelems", pa.int64()),
    ("Group size", "group_size", pa.int64()),
    ("dtype", "dtype", pa.string()),
    ("Process Group Name", "pg_name", pa.string()),
    ("Process Group Ranks", "pg_ranks", pa.string()),
    ("Seq", "seq_arg", pa.int64()),  # the process group's own sequence number (recent torch)
]
# Older torch names the group by a number only.
_PG_ID = "Process Group ID"
COMM_CALL = r"^(record_param_comms$|ncclDevKernel|ncclKernel|gloo:|nccl:)"
# What the fast reader decodes while it reads: names starting so (a superset of COMM_CALL).
COMM_CALL_PREFIXES = ("record_param_comms", "ncclDevKernel", "ncclKernel", "gloo:", "nccl:")

RAW_SCHEMA = pa.schema(
    [
        ("index", pa.int64()),  # position in traceEvents, for error messages
        ("cat", pa.string()),
        ("name", pa.string()),
        ("pid", pa.int64()),  # null when Kineto wrote a label ("Spans") instead of a number
        ("tid", pa.int64()),
        ("ts_ns", pa.int64()),  # trace clock, baseTimeNanoseconds added
        ("dur_ns", pa.int64()),
        ("correlation", pa.int64()),
        ("arg_device", pa.int64()),
        ("arg_stream", pa.int64()),
        *[(column, typ) for _, column, typ in _COMM_ARGS],
        ("input_bytes", pa.int64()),  # bytes of the first input of gloo annotations
    ]
)


@dataclass(frozen=True)
class RawTrace:
    """A parsed trace file: its top-level fields and its complete events."""

    path: Path
    header: dict[str, Any]
    events: pa.Table  # RAW_SCHEMA
    fast: bool  # read by the fast reader

    @property
    def base_ns(self) -> int:
        return _base_ns(self.header)


def load_trace(path: Path, *, fast: bool = True, piece: int = PIECE) -> RawTrace:
    """Read a Kineto trace (.json or .json.gz); raise TraceError naming the problem.
    `fast=False` forces the general reader (tests compare the two); `piece` is the text the
    fast reader parses at once."""
    with system_allocator():
        try:
            return _load(path, fast, piece)
        except RecursionError as exc:  # a value nested deeper than Python's stack
            raise TraceError(f"{path}: not valid JSON: nested too deeply") from exc


def _load(path: Path, fast: bool, piece: int) -> RawTrace:
    if fast and not native.BUILT:
        native.say_not_built()
        fast = False
    return raw_trace(path, read_stream(path, COMM_CALL_PREFIXES, piece=piece) if fast else None)


def raw_trace(path: Path, result: FastRead | None) -> RawTrace:
    """The RawTrace of what the fast reader read of `path`; None: the general reader reads it."""
    decode: Callable[[int], Any]
    if result is not None:
        header, table, decode = result.header, result.table, result.decoded.get
    else:  # the general reader needs the whole text (odd values, or an error to word)
        text = read_text(path)
        header, table, items = read_general(path, text)
        decode = _item_of(items)
        del text
    events = _add_comm_args(_finish(path, header, table), decode)
    return RawTrace(path, header, events, fast=result is not None)


def _item_of(items: list[Any]) -> Callable[[int], Any]:
    return items.__getitem__


def _base_ns(header: dict[str, Any]) -> int:
    base = header.get("baseTimeNanoseconds", 0)
    return base if isinstance(base, int) and not isinstance(base, bool) else 0


def _finish(path: Path, header: dict[str, Any], table: pa.Table) -> pa.Table:
    """The JSON-shaped table (one row per traceEvents entry, or the fast reader's complete
    events with their 'index') → RAW_SCHEMA rows of 'X' events, collective arguments still
    empty."""
    if "index" not in table.column_names:  # the general reader's: every traceEvents entry
        table = table.append_column("index", pa.array(np.arange(table.num_rows, dtype=np.int64)))
        table = table.filter(pc.equal(table["ph"], "X"))
    _check_required(path, table)
    try:
        ts_ns = _thousandths(table["ts"])
        base = _base_ns(header)
        if not -(2**63) <= base < 2**63:
            raise TraceError(f"{path}: baseTimeNanoseconds is out of range ({base})")
        if base:
            ts_ns = pc.add_checked(ts_ns, base)
        dur_ns = pc.cast(pc.round(pc.multiply(table["dur"], 1000.0)), pa.int64())
    except pa.ArrowInvalid as exc:
        raise TraceError(f"{path}: timestamps or durations out of range ({exc})") from exc
    args = table["args"].combine_chunks() if table.num_rows else None
    n = table.num_rows
    columns: dict[str, Any] = {
        "index": table["index"],
        "cat": table["cat"],
        "name": table["name"],
        "pid": _with_labels(table["pid"], table["pis"]),
        "tid": _with_labels(table["tid"], table["tis"]),
        "ts_ns": ts_ns,
        "dur_ns": dur_ns,
    }
    for key, column in (
        ("correlation", "correlation"),
        ("device", "arg_device"),
        ("stream", "arg_stream"),
    ):
        columns[column] = (
            pc.struct_field(args, key) if args is not None else pa.nulls(0, pa.int64())
        )
    for _, column, typ in _COMM_ARGS:
        columns[column] = pa.nulls(n, typ)
    columns["input_bytes"] = pa.nulls(n, pa.int64())
    return pa.table(columns, schema=RAW_SCHEMA)


def _thousandths(ts: pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Timestamps in µs → int64 thousandths of a µs (ns). The fast reader's are that already;
    the general reader's decimal(24,3) holds them as its unscaled integer (both readers refuse
    numbers from 9e15 µs, so it fits int64)."""
    if pa.types.is_integer(ts.type):
        return ts
    array = ts.combine_chunks()
    if not len(array):
        return pa.array([], pa.int64())
    start = 2 * array.offset
    words = np.frombuffer(array.buffers()[1], np.int64)[start : start + 2 * len(array)]
    low, high = words[0::2], words[1::2]
    if array.null_count or not (high == low >> 63).all():  # pragma: no cover - refused before
        return pc.cast(pc.multiply(ts, pa.scalar(1000, pa.decimal128(4, 0))), pa.int64())
    return pa.array(np.ascontiguousarray(low))


def _with_labels(numbers: pa.ChunkedArray, labels: pa.ChunkedArray) -> pa.ChunkedArray:
    """pid/tid: the number, else the number of a label (the few events where Kineto wrote a
    label: a regex on those rows only)."""
    labelled = _valid(labels) & ~_valid(numbers)
    if not labelled.any():
        return numbers
    found = _label_number(labels.take(pa.array(np.flatnonzero(labelled))))
    return pc.replace_with_mask(
        numbers.combine_chunks(), pa.array(labelled), found.combine_chunks()
    )


def _valid(column: pa.ChunkedArray) -> npt.NDArray[np.bool_]:
    return np.asarray(pc.is_valid(column).to_numpy(zero_copy_only=False), dtype=bool)


def _label_number(labels: pa.ChunkedArray) -> pa.ChunkedArray:
    """'stream 7' → 7 (older Kineto labels GPU streams); other labels → null."""
    digits = pc.extract_regex(labels, r"^(?:stream )?(?P<n>\d+)\s*$")
    return pc.cast(pc.struct_field(digits, "n"), pa.int64())


def _check_required(path: Path, table: pa.Table) -> None:
    for field, what in (
        ("name", "name"),
        ("ts", "timestamp ('ts')"),
        ("dur", "duration ('dur')"),
    ):
        bad = pc.is_null(table[field])
        if pc.any(bad).as_py():
            _fail_at(path, table, bad, f"has no {what}")
    no_pid = pc.and_(pc.is_null(table["pid"]), pc.is_null(table["pis"]))
    if pc.any(no_pid).as_py():
        _fail_at(path, table, no_pid, "has no 'pid'")
    no_tid = pc.and_(pc.is_null(table["tid"]), pc.is_null(table["tis"]))
    if pc.any(no_tid).as_py():
        _fail_at(path, table, no_tid, "has no 'tid'")
    negative = pc.less(table["dur"], 0.0)
    if pc.any(negative).as_py():
        dur = table["dur"][_first_true(negative)].as_py()
        _fail_at(path, table, negative, f"has a negative duration ({dur} µs)")


def _first_true(mask: pa.ChunkedArray | pa.Array) -> int:
    values = np.asarray(pc.fill_null(mask, False).to_numpy(zero_copy_only=False), dtype=bool)
    return int(np.flatnonzero(values)[0])


def _fail_at(path: Path, table: pa.Table, mask: pa.ChunkedArray, problem: str) -> None:
    row = _first_true(mask)
    index = table["index"][row].as_py()
    name = table["name"][row].as_py()
    label = f" ({name!r})" if name is not None else ""
    raise TraceError(f"{path}: traceEvents[{index}]{label} {problem}")


# ---------------------------------------------------------------------------------------------
# Arguments of collectives


def _add_comm_args(events: pa.Table, decode: Callable[[int], Any]) -> pa.Table:
    """Fill the collective columns of the events that are collective calls, from their own
    JSON (decoded for those rows alone: a few percent of a trace)."""
    if not events.num_rows:
        return events
    names = taxonomy.distinct(events["name"])
    calls = pc.match_substring_regex(names.values, COMM_CALL).to_numpy(zero_copy_only=False)
    rows = np.flatnonzero(names.mask(np.asarray(calls, dtype=bool)))
    if not len(rows):
        return events
    decoded = [decode(i) for i in events["index"].to_numpy()[rows].tolist()]
    args = [_args_of(event) for event in decoded]
    found: dict[str, pa.Array] = {}
    for key, column, typ in _COMM_ARGS:
        if column == "pg_name":  # older torch names the group by its number only
            raw = [v if (v := a.get(key)) is not None else a.get(_PG_ID) for a in args]
        else:
            raw = [a.get(key) for a in args]
        found[column] = _arg_column(raw, typ)
    bytes_in = [_first_input_bytes(a) if "Input Dims" in a else None for a in args]
    found["input_bytes"] = pa.array(bytes_in, pa.int64())
    for column, values in found.items():
        position = events.schema.get_field_index(column)
        events = events.set_column(position, column, spread(values, rows, events.num_rows))
    return events


def spread(
    values: pa.Array | pa.ChunkedArray, at: npt.NDArray[np.int64], n: int
) -> pa.Array | pa.ChunkedArray:
    """A column of `n` rows holding `values` at rows `at` (ascending), nulls elsewhere."""
    if values.null_count == len(values):
        return pa.nulls(n, values.type)
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    position = np.full(n, len(at), dtype=np.int64)  # the others: the null past the end
    position[at] = np.arange(len(at))
    return pa.concat_arrays([values, pa.nulls(1, values.type)]).take(pa.array(position))


def _args_of(event: Any) -> dict[str, Any]:
    args = event.get("args") if isinstance(event, dict) else None
    return args if isinstance(args, dict) else {}


def _arg_column(raw: list[Any], typ: pa.DataType) -> pa.Array:
    """One argument of every call as a column of `typ`: Arrow infers the common case (all
    whole numbers, or all strings, or absent) in one call; any other value (a float, a list, a
    Decimal from the general reader) goes through integer_arg / text_arg one by one."""
    try:
        inferred = pa.array(raw)
    except (pa.ArrowException, OverflowError, UnicodeError):
        inferred = None
    if inferred is not None and (inferred.type == typ or pa.types.is_null(inferred.type)):
        return inferred.cast(typ)
    if pa.types.is_string(typ):
        return pa.array([text_arg(v) for v in raw], typ)
    return pa.array([integer_arg(v) for v in raw], typ)


def _first_input_bytes(args: dict[str, Any]) -> int | None:
    """Bytes of the first input, from the recorded shapes (gloo annotations carry no message
    size otherwise)."""
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not isinstance(dims, list) or not isinstance(types, list) or not dims or not types:
        return None
    shape, dtype = dims[0], types[0]
    size = dtype_bytes(dtype) if isinstance(dtype, str) else None
    if size is None or not isinstance(shape, list):
        return None
    count = 1
    for extent in shape:
        if not isinstance(extent, int) or isinstance(extent, bool) or extent < 0:
            return None
        count *= extent
    total = count * size
    return total if total < 2**63 else None


_DTYPE_BYTES = {
    "float": 4,
    "float32": 4,
    "double": 8,
    "float64": 8,
    "half": 2,
    "c10::half": 2,
    "float16": 2,
    "bfloat16": 2,
    "c10::bfloat16": 2,
    "long": 8,
    "long int": 8,
    "int64": 8,
    "int": 4,
    "int32": 4,
    "short": 2,
    "short int": 2,
    "int16": 2,
    "char": 1,
    "signed char": 1,
    "unsigned char": 1,
    "byte": 1,
    "uint8": 1,
    "int8": 1,
    "bool": 1,
    "complexfloat": 8,
    "c10::complex<float>": 8,
    "complexdouble": 16,
    "c10::complex<double>": 16,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}
_DTYPE_SPACES = re.compile(r"\s+")


def dtype_bytes(dtype: str | None) -> int | None:
    """Size of one element of a dtype as the profiler names it ("Float", "c10::BFloat16"…)."""
    if not dtype:
        return None
    return _DTYPE_BYTES.get(_DTYPE_SPACES.sub(" ", dtype.strip().lower()))
