"""The fast JSON reader: the file streamed in pieces of a few MB (gunzipped on the way), the
`traceEvents` array cut at the commas between events (found with numpy) and each piece's
events parsed by DuckDB's JSON functions (yyjson in C++; unknown fields are skipped there) into
Arrow columns. DuckDB hands each field over as its JSON text, so the JSON type of every value
is checked here, and any value of an unexpected type sends the file to the general reader,
which words the error; only the timestamp is converted by DuckDB itself (a JSON number read
as a decimal stays exact, where its text would be a float64's). Only the complete events of a
piece are kept before the next one is read, so the peak memory is the result plus one piece,
never the whole text. Returns None whenever the file needs the general reader instead.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from perfdiag import taxonomy
from perfdiag.kineto.json_shape import (
    ARGS,
    GZIP_MAGIC,
    INFLATE_ERRORS,
    JSON_SCHEMA,
    MAX_NUMBER,
    TRACE_EVENTS_KEY,
    TraceError,
    inflater,
)

Bytes = npt.NDArray[np.uint8]

_NEWLINE, _SPACE, _COMMA, _TAB, _CR = 10, 32, 44, 9, 13
_OPEN, _CLOSE = 123, 125  # { }
_MAX_INDENT = 64  # blanks looked at between the events of a pretty-printed file
_NOT_BLANK = re.compile(rb"\S")
PIECE = 1 << 22  # bytes of JSON text parsed at once: bounds the memory of the parse
_READ = 1 << 20  # compressed bytes read at once
_FLOAT = pa.float64()
_NULL_STRING = pa.scalar(None, pa.string())
_COMPLETE_SCHEMA = JSON_SCHEMA.remove(JSON_SCHEMA.get_field_index("ph"))
# Every field as its JSON text (its type is checked here), but the timestamp: DuckDB reads a
# number as a float64 before writing its text, and 1.7e15 µs with 3 decimals needs more.
_STRUCTURE = {
    **{field.name: "JSON" for field in _COMPLETE_SCHEMA if field.name not in ("pis", "tis")},
    "ph": "JSON",
    "ts": "DECIMAL(24,3)",
    "args": {field.name: "JSON" for field in ARGS},
}
_SELECT = f"from_json(line, '{json.dumps(_STRUCTURE)}') AS event"
_CONNECTION: list[Any] = []  # the process's DuckDB database, made on first use
_CONNECTION_LOCK = threading.Lock()
_THREAD = threading.local()
_LINES = pa.schema([("line", pa.string())])
_BATCH = 4096  # events per Arrow batch handed to DuckDB


def _duckdb() -> Any:
    """The duckdb module, imported on first use (only Kineto import needs it)."""
    import duckdb

    return duckdb


def _cursor() -> Any:
    """This thread's DuckDB cursor (a connection serves one thread at a time)."""
    cursor = getattr(_THREAD, "cursor", None)
    if cursor is None:
        with _CONNECTION_LOCK:
            if not _CONNECTION:
                # One thread: a second one cut a file's wall time by a tenth for 10–40% more
                # CPU. Parallelism comes from reading files side by side instead (perfdiag
                # analyze), and the agent reads one window beside the training job.
                _CONNECTION.append(_duckdb().connect(config={"threads": 1}))
            cursor = _THREAD.cursor = _CONNECTION[0].cursor()
    return cursor


@dataclass
class FastRead:
    """What the fast reader got from a file."""

    header: dict[str, Any]  # the top-level fields but traceEvents
    table: pa.Table  # JSON_SCHEMA without 'ph', complete ('X') events only, plus 'index'
    decoded: dict[int, Any]  # traceEvents index → the event, for the events named in `decode`


def read_stream(path: Path, decode: str, *, piece: int = PIECE) -> FastRead | None:
    """Read `path` (JSON or gzipped JSON); None: the general reader must read it.

    `decode` is a regex on event names: those complete events are also decoded whole (their
    nested arguments), while their text is at hand. Raises TraceError for gzip damage.
    """
    reader = _Reader(decode, piece)
    for text in _pieces(path, piece):
        if not reader.feed(text):
            return None
    return reader.finish()


class _Reader:
    def __init__(self, decode: str, piece: int) -> None:
        self.decode = decode
        self.piece = piece
        self.prefix: bytes | None = None  # the file up to and including the array's '['
        self.pending = bytearray()  # text not parsed yet
        self.rows = 0  # traceEvents entries parsed so far
        self.parts: list[pa.Table] = []
        self.decoded: dict[int, Any] = {}
        self.cursor = _cursor()

    def feed(self, text: bytes) -> bool:
        self.pending += text
        if self.prefix is None:
            found = self._find_array()
            if found is None:
                return True  # the array has not started yet
            if not found:
                return False
        if len(self.pending) < self.piece:
            return True  # a piece's worth first: a small file is parsed in one query, at the end
        buffer = np.frombuffer(self.pending, dtype=np.uint8)
        separators = _separators(buffer)
        if not len(separators):
            return True
        cut = int(separators[-1])
        escapes = self.pending.find(b"\\", 0, cut) >= 0
        ok = self._parse(buffer[:cut], separators[:-1], escapes)
        del buffer
        self.pending = self.pending[cut + 1 :]
        return ok

    def finish(self) -> FastRead | None:
        if self.prefix is None:
            return None
        text = b"[" + bytes(self.pending)
        end = _events_array_end(text, 0)
        if end is None:
            return None
        try:
            header = json.loads(self.prefix + text[end:])
        except ValueError:
            return None
        if not isinstance(header, dict):
            return None
        header.pop("traceEvents", None)
        tail = bytearray(text[1:end])
        last = np.frombuffer(tail, dtype=np.uint8)
        if _NOT_BLANK.search(last.data) is not None:
            if not self._parse(last, _separators(last), tail.find(b"\\") >= 0):
                return None
        elif self.rows:
            return None  # a trailing comma: not JSON
        table = pa.concat_tables(self.parts) if self.parts else _EMPTY
        return FastRead(header, table, self.decoded)

    def _find_array(self) -> bool | None:
        """Split off the text up to the traceEvents array: True when done, None when the
        array has not started yet, False when traceEvents is not followed by an array."""
        key = self.pending.find(TRACE_EVENTS_KEY)
        if key < 0:
            return None
        lb = self.pending.find(b"[", key)
        if lb < 0:
            return None
        if self.pending[key + len(TRACE_EVENTS_KEY) : lb].strip() != b":":
            return False
        self.prefix = bytes(self.pending[: lb + 1])
        self.pending = self.pending[lb + 1 :]
        return True

    def _parse(self, text: Bytes, separators: npt.NDArray[np.intp], escapes: bool) -> bool:
        """Parse one run of whole events (cut at `separators`) and keep its complete ones.
        `escapes`: whether the text holds a backslash (string escapes: rare in traces)."""
        events = _events(self.cursor, text, separators)
        if events is None:
            return False
        complete = np.asarray(pc.equal(events.field("ph"), '"X"').fill_null(False))
        rows = np.flatnonzero(complete)
        table = _complete_events(events.take(pa.array(rows)), escapes)
        if table is None:
            return False
        starts = np.concatenate([[0], separators + 1])
        stops = np.concatenate([separators, [len(text)]])

        def decoded(row: int) -> Any:
            try:
                return json.loads(text[starts[row] : stops[row]].tobytes())
            except ValueError:
                return None

        # DuckDB reads a boolean timestamp as 1 or 0: look at the few events where it is.
        small = pc.and_(pc.greater_equal(table["ts"], 0), pc.less_equal(table["ts"], 1))
        for row in rows[np.asarray(small)].tolist():
            if isinstance((decoded(row) or {}).get("ts"), bool):
                return False
        # The regex runs on the piece's distinct names (a few hundred of its ~10k events).
        names = taxonomy.distinct(table["name"])
        matched = pc.match_substring_regex(names.values, self.decode)
        named = names.mask(np.asarray(matched.to_numpy(zero_copy_only=False), dtype=bool))
        for row in rows[named].tolist():
            self.decoded[self.rows + row] = decoded(row)
        index = pa.array(rows + self.rows, pa.int64())
        self.rows += len(events)
        self.parts.append(table.append_column("index", index))
        return True


_EMPTY = _COMPLETE_SCHEMA.append(pa.field("index", pa.int64())).empty_table()


def _pieces(path: Path, size: int) -> Iterator[bytes]:
    """The file's text in pieces of about `size` bytes, gunzipped when it is gzip."""
    try:
        with path.open("rb") as fh:
            head = fh.read(2)
            fh.seek(0)
            if head != GZIP_MAGIC:
                while text := fh.read(size):
                    yield text
                return
            stream = inflater()
            while not stream.eof:
                data = stream.unconsumed_tail or fh.read(_READ)
                try:
                    text = stream.decompress(data, size)  # b"" in: drains what it holds
                except INFLATE_ERRORS as exc:
                    raise TraceError(f"{path}: corrupt gzip data ({exc})") from exc
                if text:
                    yield text
                elif not data:
                    raise TraceError(
                        f"{path}: truncated gzip data (the file ends before the stream does)"
                    )
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from exc


def _events(cursor: Any, text: Bytes, separators: npt.NDArray[np.intp]) -> pa.StructArray | None:
    """The events of `text` (cut at `separators`) as a struct array of their fields' JSON
    texts (the timestamp as a decimal); None when one does not parse or is not an object."""
    offsets = np.empty(len(separators) + 2, dtype=np.int32)  # a piece is far below 2 GiB
    offsets[0], offsets[-1] = 0, len(text)
    offsets[1:-1] = separators + 1
    text[separators] = _SPACE  # an event's text ends with blanks, not with the comma
    lines = pa.StringArray.from_buffers(len(offsets) - 1, pa.py_buffer(offsets), pa.py_buffer(text))
    batches = [
        pa.record_batch({"line": lines.slice(start, _BATCH)})
        for start in range(0, len(lines), _BATCH)
    ]
    try:  # DuckDB keeps the rows in order (its preserve_insertion_order is on by default)
        parsed = (
            cursor.from_arrow(pa.Table.from_batches(batches, _LINES))
            .select(_SELECT)
            .to_arrow_table()
        )
    except (_duckdb().Error, UnicodeDecodeError):
        return None  # not JSON (or not UTF-8): the general reader words it
    events: pa.StructArray = parsed.column(0).combine_chunks()
    return None if events.null_count else events  # an entry that is not an object


def _complete_events(events: pa.StructArray, escapes: bool) -> pa.Table | None:
    """The complete events' columns (JSON_SCHEMA without 'ph'); None when a value has another
    JSON type than the general reader accepts there, or is out of its range. `escapes`: whether
    the events' text holds a backslash."""
    fields = dict(zip([f.name for f in events.type], events.flatten(), strict=True))
    cat, name = _string(fields["cat"], escapes), _string(fields["name"], escapes)
    pid, pis = _identifier(fields["pid"], escapes)
    tid, tis = _identifier(fields["tid"], escapes)
    ts: pa.Array = fields["ts"]
    dur = _number(fields["dur"])
    if cat is None or name is None or pid is None or tid is None or dur is None:
        return None
    if ts.null_count or not _in_range(ts):  # absent, or not a number (DuckDB read it as null)
        return None
    args = fields["args"].flatten()
    arg_values = [_integer_arg(column) for column in args]
    if any(column is None for column in arg_values):
        return None
    return pa.table(
        {
            "cat": cat,
            "name": name,
            "pid": pid,
            "pis": pis,
            "tid": tid,
            "tis": tis,
            "ts": ts,
            "dur": dur,
            "args": pa.StructArray.from_arrays(arg_values, fields=list(ARGS)),
        },
        schema=_COMPLETE_SCHEMA,
    )


def _string(texts: pa.Array, escapes: bool) -> pa.Array | None:
    """JSON strings (or null) → their values; None when another JSON type is there.
    `escapes`: whether the text may hold a backslash escape (rare: '\\"', '\\u00e9')."""
    quoted = pc.starts_with(texts, '"')
    if pc.all(quoted).as_py() is False and not _all_null(texts, quoted):
        return None
    return _unquote(texts, quoted, escapes)


def _all_null(texts: pa.Array, quoted: pa.Array) -> bool:
    """Whether every text that is not a JSON string is JSON's null."""
    return not pc.any(pc.invert(pc.or_(quoted, pc.equal(texts, "null")))).as_py()


def _unquote(texts: pa.Array, quoted: pa.Array, escapes: bool) -> pa.Array:
    values = pc.utf8_slice_codeunits(texts, 1, -1)
    if pc.all(quoted).as_py() is False:
        values = pc.if_else(quoted, values, _NULL_STRING)
    if not escapes:
        return values
    escaped = np.flatnonzero(np.asarray(pc.match_substring(values, "\\").fill_null(False)))
    if not len(escaped):
        return values
    decoded = [json.loads(texts[int(row)].as_py()) for row in escaped]
    mask = np.zeros(len(texts), dtype=bool)
    mask[escaped] = True
    return pc.replace_with_mask(values, pa.array(mask), pa.array(decoded, pa.string()))


def _identifier(texts: pa.Array, escapes: bool) -> tuple[pa.Array | None, pa.Array]:
    """pid/tid: (the integers, the labels written as strings); None for other JSON types."""
    quoted = pc.starts_with(texts, '"')
    if not pc.any(quoted).as_py():
        return _number(texts, pa.int64()), pa.nulls(len(texts), pa.string())
    labels = _unquote(texts, quoted, escapes)
    return _number(pc.if_else(quoted, _NULL_STRING, texts), pa.int64()), labels


def _number(texts: pa.Array, to: pa.DataType = _FLOAT) -> pa.Array | None:
    """JSON numbers (or null) → `to`; None for other JSON types, numbers that are not of type
    `to` (1.5 as an integer) and numbers out of the general reader's range."""
    if pc.any(pc.equal(texts, "null")).as_py():
        texts = pc.if_else(pc.equal(texts, "null"), _NULL_STRING, texts)
    try:
        numbers = pc.cast(texts, to)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None  # a string, boolean, array or object (or 1.5 as an integer)
    return numbers if _in_range(numbers) else None


def _in_range(numbers: pa.Array) -> bool:
    if numbers.null_count == len(numbers):
        return True
    if pa.types.is_floating(numbers.type) and pc.any(pc.is_nan(numbers)).as_py():
        return False
    low, high = pc.min_max(numbers).values()
    return float(low.as_py()) > -MAX_NUMBER and float(high.as_py()) < MAX_NUMBER


def _integer_arg(texts: pa.Array) -> pa.Array | None:
    """An integer argument: JSON integers → int64, strings → null (as
    general_reader.integer_arg); None for anything else (1.0, 1e3, true, objects), which the
    general reader sorts out."""
    quoted = pc.starts_with(texts, '"')
    if pc.any(quoted).as_py():
        texts = pc.if_else(quoted, _NULL_STRING, texts)
    return _number(texts, pa.int64())


def _separators(text: Bytes) -> npt.NDArray[np.intp]:
    """The commas between events ('}' blanks ',' blanks '{'). A comma whose next non-blank
    byte is not in `text` (yet) is not one."""
    closes = np.flatnonzero(text[:-1] == _CLOSE)  # a few per event: then look one byte on
    commas = closes[text[closes + 1] == _COMMA] + 1
    following = np.zeros(len(commas), dtype=np.uint8)  # the next non-blank byte
    pending = np.arange(len(commas))
    size = len(text)
    for step in range(1, _MAX_INDENT):
        if not len(pending):
            break
        at = commas[pending] + step
        beyond = at >= size
        pending = pending[~beyond]  # undecided: the text ends first
        byte = text[at[~beyond]]
        blank = (byte == _SPACE) | (byte == _NEWLINE) | (byte == _TAB) | (byte == _CR)
        following[pending[~blank]] = byte[~blank]
        pending = pending[blank]
    separators: npt.NDArray[np.intp] = commas[following == _OPEN]
    return separators


def _events_array_end(data: bytes, lb: int) -> int | None:
    """Index of the ']' closing the traceEvents array opened at `lb`: the last ']' that follows
    an event (or the '[') and is followed by the rest of a JSON object."""
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
