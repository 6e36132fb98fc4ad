"""Kineto Chrome-trace JSON(.gz) → one Arrow table of its complete ('X') events.

Two readers give the same table:
- the fast one turns the `traceEvents` array into newline-delimited JSON with a few
  `bytes.replace` passes (raw newlines can only be whitespace in JSON, and Kineto separates
  events the same way throughout a file) and parses it with pyarrow's multi-threaded JSON reader
  against an explicit schema, so unknown `args` are skipped in C++;
- the general one (`json.loads` and a loop) reads any valid JSON, and is used whenever the fast
  one cannot (unusual formatting, unusual types) and to word the error for malformed input.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

GZIP_MAGIC = b"\x1f\x8b"
TRACE_EVENTS_KEY = b'"traceEvents"'


class TraceError(ValueError):
    """A trace cannot be read; the message names the file and the problem."""


# The `args` of an event that perfdiag reads (others are skipped by the parser).
_ARGS_FIELDS: list[tuple[str, str, pa.DataType]] = [
    ("External id", "external_id", pa.int64()),
    ("correlation", "correlation", pa.int64()),
    ("device", "arg_device", pa.int64()),
    ("stream", "arg_stream", pa.int64()),
    ("Collective name", "collective", pa.string()),
    ("In msg nelems", "in_nelems", pa.int64()),
    ("Out msg nelems", "out_nelems", pa.int64()),
    ("Group size", "group_size", pa.int64()),
    ("dtype", "dtype", pa.string()),
    ("Process Group Name", "pg_name", pa.string()),
    ("Process Group Ranks", "pg_ranks", pa.string()),
]

# Kineto writes ts as µs with 3 decimals (ns); decimal keeps them exact where float64 cannot
# (epoch µs ≈ 1.7e15 has a float64 step of 0.25 µs).
_TS_TYPE = pa.decimal128(24, 3)

_JSON_SCHEMA = pa.schema(
    [
        ("ph", pa.string()),
        ("cat", pa.string()),
        ("name", pa.string()),
        ("pid", pa.int64()),
        ("pis", pa.string()),
        ("tid", pa.int64()),
        ("tis", pa.string()),
        ("ts", _TS_TYPE),
        ("dur", pa.float64()),
        ("args", pa.struct([(key, typ) for key, _, typ in _ARGS_FIELDS])),
    ]
)

RAW_SCHEMA = pa.schema(
    [
        ("index", pa.int64()),  # position in traceEvents, for error messages
        ("cat", pa.string()),
        ("name", pa.string()),
        ("pid", pa.int64()),  # null when Kineto wrote a label ("Spans") instead of a number
        ("tid", pa.int64()),
        ("ts_ns", pa.int64()),  # trace clock, baseTimeNanoseconds added
        ("dur_ns", pa.int64()),
        *[(column, typ) for _, column, typ in _ARGS_FIELDS],
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


def load_trace(path: Path) -> RawTrace:
    """Read a Kineto trace (.json or .json.gz); raise TraceError naming the problem."""
    try:
        blob = path.read_bytes()
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    data = _decompress(path, blob)
    fast = _read_fast(data)
    if fast is not None:
        header, table, body = fast
        events = _finish(path, header, table)
        if events.num_rows and _has_gloo(events):
            events = _add_input_bytes_fast(events, body, table.num_rows)
        return RawTrace(path, header, events, fast=True)
    header, table = _read_general(path, data)
    return RawTrace(path, header, _finish(path, header, table), fast=False)


def _decompress(path: Path, blob: bytes) -> bytes:
    if not blob.startswith(GZIP_MAGIC):
        return blob
    try:
        inflater = zlib.decompressobj(wbits=47)  # gzip (or zlib) header, auto-detected
        data = inflater.decompress(blob)
        if not inflater.eof:
            raise TraceError(f"{path}: truncated gzip data (the file ends before the stream does)")
        return data
    except zlib.error as exc:
        raise TraceError(f"{path}: corrupt gzip data ({exc})") from exc


def _base_ns(header: dict[str, Any]) -> int:
    base = header.get("baseTimeNanoseconds", 0)
    return base if isinstance(base, int) and not isinstance(base, bool) else 0


# ---------------------------------------------------------------------------------------------
# Fast reader


def _read_fast(data: bytes) -> tuple[dict[str, Any], pa.Table, npt.NDArray[np.uint8]] | None:
    """The events as a table (and the newline-delimited text it was read from, one event per
    line), or None when this file needs the general reader."""
    key = data.find(TRACE_EVENTS_KEY)
    if key < 0:
        return None
    lb = data.find(b"[", key)
    if lb < 0 or data[key + len(TRACE_EVENTS_KEY) : lb].strip() != b":":
        return None
    rb = _events_array_end(data, lb)
    if rb is None:
        return None
    try:
        header = json.loads(data[: lb + 1] + data[rb:])
    except ValueError:
        return None
    if not isinstance(header, dict):
        return None
    header.pop("traceEvents", None)
    text = _as_event_lines(data, lb + 1, rb)
    if not len(text) or not (text != _SPACE).any():
        return header, _JSON_SCHEMA.empty_table(), text
    options = pj.ParseOptions(explicit_schema=_JSON_SCHEMA, unexpected_field_behavior="ignore")
    try:
        table = pj.read_json(
            pa.BufferReader(pa.py_buffer(text)),
            parse_options=options,
            read_options=pj.ReadOptions(block_size=1 << 22),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    return header, table, text


_NEWLINE, _SPACE, _COMMA, _TAB, _CR = 10, 32, 44, 9, 13
_OPEN, _CLOSE = 123, 125  # { }


def _as_event_lines(data: bytes, start: int, stop: int) -> npt.NDArray[np.uint8]:
    """data[start:stop] (the inside of the traceEvents array) rewritten in place, byte for byte,
    into one event per line: raw newlines are whitespace in JSON, so they become spaces; the
    commas between events ('}' ws* ',' ws* '{') become the newlines. Label pids/tids
    ("pid": "Spans") are renamed "pis"/"tis" so that the number columns keep one type."""
    text: npt.NDArray[np.uint8] = np.frombuffer(
        data, dtype=np.uint8, count=stop - start, offset=start
    ).copy()
    if not len(text):
        return text
    commas = np.flatnonzero(text == _COMMA)
    text[text == _NEWLINE] = _SPACE
    commas = commas[(commas > 0) & (text[np.maximum(commas - 1, 0)] == _CLOSE)]
    following = np.zeros(len(commas), dtype=np.uint8)
    last = len(text) - 1
    for step in range(1, 9):  # the next non-blank byte after the comma
        byte = text[np.minimum(commas + step, last)]
        fill = (following == 0) & (byte != _SPACE) & (byte != _TAB) & (byte != _CR)
        following[fill] = byte[fill]
    text[commas[following == _OPEN]] = _NEWLINE
    for label in (b'"pid": "', b'"tid": "'):
        pos = data.find(label, start, stop)
        while pos >= 0:
            text[pos - start + 3] = ord("s")
            pos = data.find(label, pos + 1, stop)
    return text


def _events_array_end(data: bytes, lb: int) -> int | None:
    """Index of the ']' closing the traceEvents array: the last ']' that follows an event (or
    the '[') and is followed by the rest of a JSON object."""
    pos = len(data)
    for _ in range(256):
        pos = data.rfind(b"]", lb, pos)
        if pos < 0:
            return None
        before = pos - 1
        while before > lb and data[before] in b" \t\r\n":
            before -= 1
        if data[before] in b"}[" and _is_object_tail(data[pos + 1 :]):
            return pos
    return None


def _is_object_tail(tail: bytes) -> bool:
    rest = tail.strip()
    if rest == b"}":
        return True
    if not rest.startswith(b","):
        return False
    try:
        return isinstance(json.loads(b"{" + rest[1:]), dict)
    except ValueError:
        return False


def _finish(path: Path, header: dict[str, Any], table: pa.Table) -> pa.Table:
    """The JSON-shaped table (one row per traceEvents entry) → RAW_SCHEMA rows of 'X' events."""
    n = table.num_rows
    table = table.append_column("index", pa.array(np.arange(n, dtype=np.int64)))
    table = table.filter(pc.equal(table["ph"], "X"))
    _check_required(path, table)
    try:
        ts_ns = pc.cast(pc.multiply(table["ts"], pa.scalar(1000, pa.decimal128(4, 0))), pa.int64())
        base = _base_ns(header)
        if base:
            ts_ns = pc.add_checked(ts_ns, base)
        dur_ns = pc.cast(pc.round(pc.multiply(table["dur"], 1000.0)), pa.int64())
    except pa.ArrowInvalid as exc:
        raise TraceError(f"{path}: timestamps or durations out of range ({exc})") from exc
    args = table["args"].combine_chunks() if table.num_rows else None
    columns: dict[str, Any] = {
        "index": table["index"],
        "cat": table["cat"],
        "name": table["name"],
        "pid": pc.coalesce(table["pid"], _label_number(table["pis"])),
        "tid": pc.coalesce(table["tid"], _label_number(table["tis"])),
        "ts_ns": ts_ns,
        "dur_ns": dur_ns,
    }
    for key, column, typ in _ARGS_FIELDS:
        if args is None:
            columns[column] = pa.array([], typ)
        else:
            columns[column] = pc.struct_field(args, key)
    if "_input_bytes" in table.column_names:
        columns["input_bytes"] = table["_input_bytes"]
    else:
        columns["input_bytes"] = pa.nulls(table.num_rows, pa.int64())
    return pa.table(columns, schema=RAW_SCHEMA)


def _label_number(labels: pa.ChunkedArray) -> pa.ChunkedArray:
    """'stream 7' → 7 (older Kineto labels GPU streams); other labels → null."""
    digits = pc.extract_regex(labels, r"^(?:stream )?(?P<n>\d+)\s*$")
    return pc.cast(pc.struct_field(digits, "n"), pa.int64())


def _check_required(path: Path, table: pa.Table) -> None:
    for field, what in (
        ("name", "a name"),
        ("ts", "a timestamp 'ts'"),
        ("dur", "a duration 'dur'"),
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
        row = _first_true(negative)
        dur = table["dur"][row].as_py()
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
# Message sizes of gloo collectives: only in the shapes ("Input Dims") of their annotations,
# whose nesting varies between events, so they are read for those few events alone.

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


def dtype_bytes(dtype: str | None) -> int | None:
    """Size of one element of a dtype as the profiler names it ("Float", "c10::BFloat16"…)."""
    if not dtype:
        return None
    return _DTYPE_BYTES.get(dtype.strip().lower())


def _has_gloo(events: pa.Table) -> bool:
    return bool(pc.any(pc.starts_with(events["name"], "gloo:")).as_py())


def _first_input_bytes(event: Any) -> int | None:
    if not isinstance(event, dict):
        return None
    args = event.get("args")
    if not isinstance(args, dict):
        return None
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not isinstance(dims, list) or not isinstance(types, list) or not dims or not types:
        return None
    shape, dtype = dims[0], types[0]
    size = dtype_bytes(dtype) if isinstance(dtype, str) else None
    if size is None or not isinstance(shape, list):
        return None
    count = 1
    for extent in shape:
        if not isinstance(extent, int) or isinstance(extent, bool):
            return None
        count *= extent
    return count * size


def _add_input_bytes_fast(
    events: pa.Table, body: npt.NDArray[np.uint8], rows_in_body: int
) -> pa.Table:
    """Fill input_bytes of gloo annotations by decoding their lines of `body` alone."""
    ends = np.flatnonzero(body == _NEWLINE)
    if len(ends) + 1 != rows_in_body:
        return events  # not one event per line: leave the sizes unknown
    starts = np.concatenate([[0], ends + 1])
    stops = np.concatenate([ends, [len(body)]])
    rows = np.flatnonzero(pc.starts_with(events["name"], "gloo:").to_numpy(zero_copy_only=False))
    index = events["index"].to_numpy()
    values: list[int | None] = [None] * events.num_rows
    for row in rows:
        line = int(index[row])
        try:
            event = json.loads(body[starts[line] : stops[line]].tobytes())
        except ValueError:
            continue
        values[int(row)] = _first_input_bytes(event)
    position = events.schema.get_field_index("input_bytes")
    return events.set_column(position, "input_bytes", pa.array(values, pa.int64()))


# ---------------------------------------------------------------------------------------------
# General reader


def _read_general(path: Path, data: bytes) -> tuple[dict[str, Any], pa.Table]:
    try:
        doc = json.loads(data, parse_float=Decimal)
    except UnicodeDecodeError as exc:
        raise TraceError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno} column {exc.colno} (byte {exc.pos})"
        if exc.pos >= len(data.rstrip()):
            raise TraceError(f"{path}: not valid JSON: the file ends early, at {where}") from exc
        raise TraceError(f"{path}: not valid JSON: {exc.msg} at {where}") from exc
    except RecursionError as exc:
        raise TraceError(f"{path}: not valid JSON: nested too deeply") from exc
    if not isinstance(doc, dict):
        raise TraceError(
            f"{path}: not a Kineto trace: the top level is a JSON {_json_type(doc)}, "
            "expected an object with 'traceEvents'"
        )
    events = doc.pop("traceEvents", None)
    if events is None:
        raise TraceError(f"{path}: not a Kineto trace: no 'traceEvents' field")
    if not isinstance(events, list):
        raise TraceError(
            f"{path}: not a Kineto trace: 'traceEvents' is a JSON {_json_type(events)}, "
            "expected an array"
        )
    return doc, _general_table(path, events)


def _json_type(value: Any) -> str:
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    return "number"


_LABEL = {"pid": "pis", "tid": "tis"}


def _general_table(path: Path, events: list[Any]) -> pa.Table:
    columns: dict[str, list[Any]] = {name: [] for name in _JSON_SCHEMA.names}
    args_columns: dict[str, list[Any]] = {key: [] for key, _, _ in _ARGS_FIELDS}
    input_bytes: list[int | None] = []
    for index, event in enumerate(events):
        if not isinstance(event, dict):
            raise TraceError(
                f"{path}: traceEvents[{index}] is a JSON {_json_type(event)}, expected an object"
            )
        ph = event.get("ph")
        columns["ph"].append(ph if isinstance(ph, str) else None)
        if ph != "X":
            for name in ("cat", "name", "pid", "pis", "tid", "tis", "ts", "dur", "args"):
                columns[name].append(None)
            for key in args_columns:
                args_columns[key].append(None)
            input_bytes.append(None)
            continue
        columns["cat"].append(_text(path, index, event, "cat"))
        columns["name"].append(_text(path, index, event, "name"))
        for field in ("pid", "tid"):
            value = event.get(field)
            if isinstance(value, str):
                columns[field].append(None)
                columns[_LABEL[field]].append(value)
            else:
                columns[field].append(_integer(path, index, event, field))
                columns[_LABEL[field]].append(None)
        columns["ts"].append(_decimal_ts(path, index, event))
        columns["dur"].append(_float(path, index, event, "dur"))
        columns["args"].append(None)
        args = event.get("args")
        args = args if isinstance(args, dict) else {}
        for key, _, typ in _ARGS_FIELDS:
            args_columns[key].append(_arg(args.get(key), typ))
        event_name = event.get("name")
        gloo = isinstance(event_name, str) and event_name.startswith("gloo:")
        input_bytes.append(_first_input_bytes(event) if gloo else None)
    arrays: dict[str, pa.Array] = {}
    for field in _JSON_SCHEMA:
        if field.name == "args":
            continue
        arrays[field.name] = pa.array(columns[field.name], field.type)
    arrays["args"] = pa.StructArray.from_arrays(
        [pa.array(args_columns[key], typ) for key, _, typ in _ARGS_FIELDS],
        names=[key for key, _, _ in _ARGS_FIELDS],
    )
    table = pa.table(arrays, schema=_JSON_SCHEMA)
    # input_bytes rides along as an extra column until _finish has filtered the 'X' rows.
    return table.append_column("_input_bytes", pa.array(input_bytes, pa.int64()))


def _text(path: Path, index: int, event: dict[str, Any], field: str) -> str | None:
    value = event.get(field)
    if value is None or isinstance(value, str):
        return value
    raise TraceError(
        f"{path}: traceEvents[{index}] field {field!r} is a JSON {_json_type(value)}, "
        "expected a string"
    )


def _number(path: Path, index: int, event: dict[str, Any], field: str) -> Decimal | None:
    value = event.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
        raise TraceError(
            f"{path}: traceEvents[{index}] field {field!r} is a JSON {_json_type(value)}, "
            "expected a number"
        )
    number = Decimal(value)
    if not number.is_finite() or abs(number) >= _MAX_NUMBER:
        raise TraceError(f"{path}: traceEvents[{index}] field {field!r} is out of range ({value})")
    return number


_MAX_NUMBER = Decimal(9 * 10**15)  # µs: beyond any clock Kineto writes, inside int64 as ns


def _integer(path: Path, index: int, event: dict[str, Any], field: str) -> int | None:
    value = _number(path, index, event, field)
    if value is None:
        return None
    if value != value.to_integral_value():
        raise TraceError(f"{path}: traceEvents[{index}] field {field!r} is not an integer")
    return int(value)


def _decimal_ts(path: Path, index: int, event: dict[str, Any]) -> Decimal | None:
    value = _number(path, index, event, "ts")
    if value is None:
        return None
    return value.quantize(Decimal("0.001"), rounding=ROUND_HALF_EVEN)


def _float(path: Path, index: int, event: dict[str, Any], field: str) -> float | None:
    value = _number(path, index, event, field)
    return None if value is None else float(value)


def _arg(value: Any, typ: pa.DataType) -> Any:
    if value is None:
        return None
    if pa.types.is_string(typ):
        return value if isinstance(value, str) else json.dumps(value, default=str)
    if isinstance(value, bool) or not isinstance(value, int | Decimal):
        return None
    number = Decimal(value)
    if not number.is_finite() or number != number.to_integral_value():
        return None
    integer = int(number)
    return integer if -(2**63) <= integer < 2**63 else None
