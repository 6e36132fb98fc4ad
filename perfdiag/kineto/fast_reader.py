"""The fast JSON reader: the file streamed in pieces of 1 MB (gunzipped on the way), each
piece's whole events parsed by a C scanner (perfdiag/kineto/_scan.c) straight into columns of
the complete events, which grow across pieces (one chunk per column at the end). The scanner
is strict JSON and reads only what the general reader reads the same way; for anything else
(malformed input, odd value types) it answers "not readable here" and the general reader
reads the file and words the error. The text of a piece is dropped once it is parsed, so the
peak memory is the result plus one piece, never the whole text. Returns None whenever the
file needs the general reader instead.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfdiag.kineto._scan import Scanner
from perfdiag.kineto.json_shape import (
    ARGS,
    GZIP_MAGIC,
    INFLATE_ERRORS,
    JSON_SCHEMA,
    TRACE_EVENTS_KEY,
    TS_TYPE,
    TraceError,
    inflater,
)
from perfdiag.regular_file import open_regular

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from perfdiag.kineto._scan import NumberColumn, StringColumn

PIECE = 1 << 20  # bytes of JSON text parsed at once: bounds the memory of the parse
_READ = 1 << 20  # compressed bytes read at once
# A chunk of columns is closed once a string column holds this much text: Arrow's string
# offsets are int32, and a piece adds at most its own size.
CHUNK_TEXT = 1 << 30
# JSON_SCHEMA without 'ph' (complete events only), plus their index in traceEvents.
_SCHEMA = JSON_SCHEMA.remove(JSON_SCHEMA.get_field_index("ph")).append(
    pa.field("index", pa.int64())
)


@dataclass
class FastRead:
    """What the fast reader got from a file."""

    header: dict[str, Any]  # the top-level fields but traceEvents
    table: pa.Table  # JSON_SCHEMA without 'ph', complete ('X') events only, plus 'index'
    decoded: dict[int, Any]  # traceEvents index → the event, for the events named in `decode`


def read_stream(path: Path, decode: tuple[str, ...], *, piece: int = PIECE) -> FastRead | None:
    """Read `path` (JSON or gzipped JSON); None: the general reader must read it.

    `decode`: name prefixes of the complete events that are also decoded whole (their nested
    arguments), while their text is at hand; events with escaped names are decoded too.
    Raises TraceError for gzip damage.
    """
    reader = _Reader(decode, piece)
    for text in _pieces(path, piece):
        if not reader.feed(text):
            return None
    return reader.finish()


class _Reader:
    def __init__(self, decode: tuple[str, ...], piece: int) -> None:
        self.scanner = Scanner(tuple(prefix.encode() for prefix in decode))
        self.piece = piece
        self.prefix: bytes | None = None  # the file up to and including the array's '['
        self.pending = bytearray()  # text not parsed yet
        self.rows = 0  # traceEvents entries parsed so far
        self.closed = False  # the array's ']' was read
        self.wait = 0  # pending bytes to have before the next parse (an event longer than a piece)
        self.chunks: list[pa.Table] = []  # the columns of the chunks closed so far
        self.decoded: dict[int, Any] = {}

    def feed(self, text: bytes) -> bool:
        self.pending += text
        if self.prefix is None:
            found = self._find_array()
            if found is None:
                return True  # the array has not started yet
            if not found:
                return False
        if self.closed or len(self.pending) < max(self.piece, self.wait):
            return True  # a piece's worth first: a small file is parsed at once, at the end
        return self._parse()

    def finish(self) -> FastRead | None:
        if self.prefix is None or not self._parse() or not self.closed:
            return None  # not JSON, or an event the scanner cannot read (the general reader will)
        try:
            header = json.loads(self.prefix + b"]" + self.pending)
        except (ValueError, RecursionError):  # the general reader words the error
            return None
        if not isinstance(header, dict):
            return None
        header.pop("traceEvents", None)
        last = _complete_events(*self.scanner.columns())
        if last.num_rows or not self.chunks:
            self.chunks.append(last)
        return FastRead(header, pa.concat_tables(self.chunks), self.decoded)

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
        del self.pending[: lb + 1]
        return True

    def _parse(self) -> bool:
        """Parse the whole events pending (until the array's end); False when the scanner
        cannot read them."""
        if self.closed:
            return True
        readable, consumed, events, closed, wanted = self.scanner.scan(self.pending, not self.rows)
        if not readable or wanted is None:
            return False
        for index, start, stop in wanted:
            # The scanner read the event: json.loads reads it too (unless it nests too deeply).
            try:
                self.decoded[index] = json.loads(self.pending[start:stop])
            except RecursionError:
                return False
        self.rows += events
        self.closed = closed
        # No whole event yet: wait for twice the text, so that an event longer than a piece
        # costs about twice its length to scan, not its length once per piece.
        self.wait = 0 if consumed else 2 * len(self.pending)
        del self.pending[:consumed]
        if self.scanner.held() >= CHUNK_TEXT:
            self.chunks.append(_complete_events(*self.scanner.columns()))
        return True


def _pieces(path: Path, size: int) -> Iterator[bytes]:
    """The file's text in pieces of about `size` bytes, gunzipped when it is gzip."""
    try:
        with open_regular(path) as fh:
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


def _complete_events(
    rows: Buffer, strings: tuple[StringColumn, ...], numbers: tuple[NumberColumn, ...]
) -> pa.Table:
    """The scanner's columns as a table of JSON_SCHEMA without 'ph', plus 'index'."""
    index = np.frombuffer(memoryview(rows), np.int64)
    length = len(index)
    cat, name, pis, tis = (_strings(length, column) for column in strings)
    pid, tid, ts, dur, correlation, device, stream = numbers
    return pa.table(
        {
            "cat": cat,
            "name": name,
            "pid": _numbers(length, pid, pa.int64()),
            "pis": pis,
            "tid": _numbers(length, tid, pa.int64()),
            "tis": tis,
            "ts": _thousandths(length, ts),
            "dur": _numbers(length, dur, pa.float64()),
            "args": pa.StructArray.from_arrays(
                [_numbers(length, column, pa.int64()) for column in (correlation, device, stream)],
                fields=list(ARGS),
            ),
            "index": pa.array(index),
        },
        schema=_SCHEMA,
    )


def _validity(length: int, valid: Buffer) -> tuple[pa.Buffer | None, int]:
    """(Arrow validity bitmap, null count) of one byte a row."""
    flags = np.frombuffer(memoryview(valid), np.bool_)
    nulls = length - int(np.count_nonzero(flags))
    if not nulls:
        return None, 0
    return pa.py_buffer(np.packbits(flags, bitorder="little")), nulls


def _strings(length: int, column: StringColumn) -> pa.Array:
    offsets, data, valid, escaped = column
    bitmap, nulls = _validity(length, valid)
    values = pa.StringArray.from_buffers(
        length, pa.py_buffer(offsets), pa.py_buffer(data), bitmap, nulls
    )
    rows = np.flatnonzero(np.frombuffer(memoryview(escaped), np.bool_))
    if not len(rows):
        return values
    # Escapes ('\"', '\u00e9') are rare in traces: json.loads decodes those few strings.
    raw = values.take(pa.array(rows)).to_pylist()
    decoded = [json.loads(f'"{text}"') for text in raw]
    mask = np.zeros(length, dtype=bool)
    mask[rows] = True
    return pc.replace_with_mask(values, pa.array(mask), pa.array(decoded, pa.string()))


def _numbers(length: int, column: NumberColumn, to: pa.DataType) -> pa.Array:
    values, valid = column
    bitmap, nulls = _validity(length, valid)
    return pa.Array.from_buffers(to, length, [bitmap, pa.py_buffer(values)], nulls)


def _thousandths(length: int, column: NumberColumn) -> pa.Array:
    """Timestamps in thousandths of a µs (int64) → decimal128 with 3 decimals, exact."""
    values, valid = column
    bitmap, nulls = _validity(length, valid)
    low = np.frombuffer(memoryview(values), np.int64)
    wide = np.empty((length, 2), np.int64)  # decimal128: 16-byte little-endian two's complement
    wide[:, 0] = low
    wide[:, 1] = low >> 63
    return pa.Array.from_buffers(TS_TYPE, length, [bitmap, pa.py_buffer(wide)], nulls)
