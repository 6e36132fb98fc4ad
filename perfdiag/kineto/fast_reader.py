"""The fast JSON reader: the file streamed in pieces of a few MB (gunzipped on the way), the
`traceEvents` array rewritten in place into one event per line and each piece parsed by
pyarrow's multi-threaded JSON reader against an explicit schema (unknown fields are skipped in
C++). Only the complete events of a piece are kept before the next one is read, so the peak
memory is the result plus one piece, never the whole text. Returns None whenever the file
needs the general reader instead.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from perfdiag.kineto.json_shape import GZIP_MAGIC, JSON_SCHEMA, TRACE_EVENTS_KEY, TraceError

Bytes = npt.NDArray[np.uint8]

_NEWLINE, _SPACE, _COMMA, _TAB, _CR = 10, 32, 44, 9, 13
_OPEN, _CLOSE = 123, 125  # { }
_MAX_INDENT = 64  # blanks looked at between the events of a pretty-printed file
_LABELS = (b'"pid": "', b'"tid": "')
_LABEL_TAIL = 1 << 16  # Kineto writes its label pids ("Spans") among the last events
_NOT_BLANK = re.compile(rb"\S")
PIECE = 1 << 22  # bytes of JSON text parsed at once: bounds the memory of the parse
_BLOCK = 1 << 20  # pyarrow block: a piece is parsed by several threads
_READ = 1 << 20  # compressed bytes read at once
_SCAN = 1 << 20  # bytes scanned for separators at once
# The parse's many short-lived buffers go to the C library's allocator, which gives them back;
# pyarrow's default (mimalloc) kept 15–40 MB more resident per file (docs/engine.md).
_PARSE_POOL = pa.system_memory_pool()


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
    reader = _Reader(decode)
    for text in _pieces(path, piece):
        if not reader.feed(text):
            return None
    return reader.finish()


class _Reader:
    def __init__(self, decode: str) -> None:
        self.decode = decode
        self.prefix: bytes | None = None  # the file up to and including the array's '['
        self.pending = bytearray()  # text not parsed yet
        self.rows = 0  # traceEvents entries parsed so far
        self.parts: list[pa.Table] = []
        self.decoded: dict[int, Any] = {}

    def feed(self, text: bytes) -> bool:
        self.pending += text
        if self.prefix is None:
            found = self._find_array()
            if found is None:
                return True  # the array has not started yet
            if not found:
                return False
        buffer = np.frombuffer(self.pending, dtype=np.uint8)
        separators = _separators(buffer)
        if not len(separators):
            return True
        cut = int(separators[-1])
        ok = self._parse(buffer[:cut], separators[:-1])
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
        last = np.frombuffer(bytearray(text[1:end]), dtype=np.uint8)
        if _NOT_BLANK.search(last.data) is not None:
            _rename_labels(last, max(0, len(last) - _LABEL_TAIL))
            if not self._parse(last, _separators(last)):
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

    def _parse(self, text: Bytes, separators: npt.NDArray[np.intp]) -> bool:
        """Parse one run of whole event lines (separators already newlines) and keep its
        complete events."""
        text[separators] = _NEWLINE
        table = _parse(text)
        if table is None:  # perhaps labels ("Spans") before the tail: rename them and retry
            _rename_labels(text, 0)
            table = _parse(text)
        if table is None or table.num_rows != len(separators) + 1:
            return False  # not one event per line: row i would not be line i
        index = pa.array(np.arange(self.rows, self.rows + table.num_rows, dtype=np.int64))
        complete = pc.fill_null(pc.equal(table["ph"], "X"), False)
        named = pc.fill_null(pc.match_substring_regex(table["name"], self.decode), False)
        calls = pc.and_(complete, named)
        rows = np.flatnonzero(np.asarray(calls.to_numpy(zero_copy_only=False)))
        if len(rows):
            starts = np.concatenate([[0], separators + 1])
            stops = np.concatenate([separators, [len(text)]])
            for row in rows.tolist():
                try:
                    event = json.loads(text[starts[row] : stops[row]].tobytes())
                except ValueError:
                    event = None
                self.decoded[self.rows + row] = event
        self.rows += table.num_rows
        kept = table.drop_columns(["ph"]).append_column("index", index).filter(complete)
        self.parts.append(kept)
        return True


_EMPTY = (
    JSON_SCHEMA.remove(JSON_SCHEMA.get_field_index("ph"))
    .append(pa.field("index", pa.int64()))
    .empty_table()
)


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
            inflater = zlib.decompressobj(wbits=47)  # gzip (or zlib) header, auto-detected
            while not inflater.eof:
                data = inflater.unconsumed_tail or fh.read(_READ)
                if not data:
                    raise TraceError(
                        f"{path}: truncated gzip data (the file ends before the stream does)"
                    )
                try:
                    text = inflater.decompress(data, size)
                except zlib.error as exc:
                    raise TraceError(f"{path}: corrupt gzip data ({exc})") from exc
                if text:
                    yield text
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from exc


def _parse(text: Bytes) -> pa.Table | None:
    options = pj.ParseOptions(explicit_schema=JSON_SCHEMA, unexpected_field_behavior="ignore")
    try:
        return pj.read_json(
            pa.BufferReader(pa.py_buffer(text)),
            parse_options=options,
            read_options=pj.ReadOptions(block_size=_BLOCK),
            memory_pool=_PARSE_POOL,
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def _separators(text: Bytes) -> npt.NDArray[np.intp]:
    """Rewrite raw newlines (whitespace in JSON) to spaces and return the commas between
    events ('}' blanks ',' blanks '{'). A comma whose next non-blank byte is not in `text`
    (yet) is not one."""
    found = []
    for lo in range(0, len(text), _SCAN):  # in slices: the temporaries stay small
        part = text[lo : lo + _SCAN]
        np.copyto(part, _SPACE, where=part == _NEWLINE)
        commas = np.flatnonzero(part == _COMMA) + lo
        found.append(commas[(commas > 0) & (text[np.maximum(commas - 1, 0)] == _CLOSE)])
    commas = np.concatenate(found) if found else np.zeros(0, dtype=np.intp)
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
        blank = (byte == _SPACE) | (byte == _TAB) | (byte == _CR)
        following[pending[~blank]] = byte[~blank]
        pending = pending[blank]
    separators: npt.NDArray[np.intp] = commas[following == _OPEN]
    return separators


def _rename_labels(text: Bytes, start: int) -> None:
    """Rename "pid": "Spans" to "pis": "Spans" (and tid) from `start` on."""
    view = text.data
    for label in _LABELS:
        for match in re.finditer(re.escape(label), view[start:]):
            text[start + match.start() + 3] = ord("s")


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
