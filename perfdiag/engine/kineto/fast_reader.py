"""The fast JSON reader: the file streamed in pieces of 512 KB (gunzipped on the way), each
piece's whole events parsed by a C scanner (perfdiag/engine/kineto/_scan.c) straight into columns of
the complete events, which grow across pieces (one chunk per column at the end). The scanner
is strict JSON and reads only what the general reader reads the same way; for anything else
(malformed input, odd value types) it answers "not readable here" and the general reader
reads the file and words the error. The text of a piece is dropped once it is parsed, so the
peak memory is the result plus one piece, never the whole text. The text outside the array,
and the array's text where a piece's worth of it holds no whole event, is squeezed
(perfdiag/engine/kineto/text.py): blanks and garbage never pile up. Returns None whenever the file
needs the general reader instead.
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

from perfdiag.engine.kineto.json_shape import ARGS, JSON_SCHEMA, TRACE_EVENTS_KEY
from perfdiag.engine.kineto.native import Scanner, Squeezer, prune
from perfdiag.engine.kineto.text import PIECE, PRUNED, pieces, squeezer

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from perfdiag.engine.kineto._scan import NumberColumn, StringColumn

_BLANK = b" \t\n\r"
# Bytes of a piece copied to complete the event the last piece cut off (Kineto's events are a
# few hundred bytes; a longer one makes the reader take the whole piece).
_BRIDGE = 1 << 16
# A chunk of columns is closed once a string column holds this much text: Arrow's string
# offsets are int32, and a piece adds at most its own size.
CHUNK_TEXT = 1 << 30
# JSON_SCHEMA without 'ph' (complete events only), its timestamps as int64 thousandths of a µs
# (the value of the decimal with its 3 decimals, exact: nothing to convert), plus their index
# in traceEvents.
_SCHEMA = (
    JSON_SCHEMA.remove(JSON_SCHEMA.get_field_index("ph"))
    .set(JSON_SCHEMA.get_field_index("ts") - 1, pa.field("ts", pa.int64()))
    .append(pa.field("index", pa.int64()))
)


@dataclass
class FastRead:
    """What the fast reader got from a file."""

    header: dict[str, Any]  # the top-level fields but traceEvents
    # JSON_SCHEMA without 'ph', ts in thousandths: complete ('X') events only, plus 'index'
    table: pa.Table
    decoded: dict[int, Any]  # traceEvents index → the event, for the events named in `decode`


def read_stream(path: Path, decode: tuple[str, ...], *, piece: int = PIECE) -> FastRead | None:
    """Read `path` (JSON or gzipped JSON); None: the general reader must read it.

    `decode`: name prefixes of the complete events that are also decoded whole (their nested
    arguments), while their text is at hand; events with escaped names are decoded too.
    Raises TraceError for gzip damage and a text above the limit (perfdiag.engine.kineto.text).
    """
    return read_pieces(pieces(path, piece), decode, piece=piece)


def read_pieces(
    texts: Iterator[bytes], decode: tuple[str, ...], *, piece: int = PIECE
) -> FastRead | None:
    """read_stream of a file's text given as its pieces (of at most `piece` bytes)."""
    reader = _Reader(decode, piece)
    for text in texts:
        if not reader.feed(text):
            return None
    return reader.finish()


class _Reader:
    def __init__(self, decode: tuple[str, ...], piece: int) -> None:
        self.scanner = Scanner(tuple(prefix.encode() for prefix in decode))
        self.piece = piece
        # (A quarter of a small piece: the tests' pieces of a few bytes cut events anywhere.)
        self.bridge = max(1, min(_BRIDGE, piece // 4))
        self.prefix: bytearray | None = None  # the file up to and including the array's '['
        self.pending = bytearray()  # text not parsed yet
        # Squeezes the text taken in (perfdiag.engine.kineto.text): before the array, after it, and
        # while a piece's worth of the array holds no whole event (blanks, or a long event).
        # None: the text is taken as it is (the scanner reads it fastest so).
        self.squeezer: Squeezer | None = squeezer()
        self.searched = 0  # pending holds no traceEvents key starting before this
        self.rows = 0  # traceEvents entries parsed so far
        self.closed = False  # the array's ']' was read
        self.wait = 0  # pending bytes to have before the next parse (an event longer than a piece)
        self.chunks: list[pa.Table] = []  # the columns of the chunks closed so far
        self.decoded: dict[int, Any] = {}

    def feed(self, text: bytes) -> bool:
        if self._streaming() and len(self.pending) + len(text) >= self.piece:
            return self._feed_array(memoryview(text))
        if not self._take(text):
            return False
        if self.prefix is None:
            found = self._find_array()
            if found is None:
                return True  # the array has not started yet
            if not found:
                return False
            self.squeezer = None
        if self.closed or len(self.pending) < max(self.piece, self.wait):
            return True  # a piece's worth first: a small file is parsed at once, at the end
        return self._parse()

    def finish(self) -> FastRead | None:
        if self.prefix is None or not self._parse() or not self.closed:
            return None  # not JSON, or an event the scanner cannot read (the general reader will)
        text, self.prefix = self.prefix, bytearray()
        text += b"]"
        text += self.pending
        self.pending = bytearray()
        # The top-level fields' arrays and objects that no reader keeps are blanked, not
        # decoded (perfdiag.engine.kineto.text); a text that is not JSON: the general reader words it.
        if prune(text)[0] != PRUNED:
            return None
        try:
            header = json.loads(text)
        except (ValueError, RecursionError):
            return None
        if not isinstance(header, dict):
            return None
        header.pop("traceEvents", None)
        last = _complete_events(*self.scanner.columns())
        if last.num_rows or not self.chunks:
            self.chunks.append(last)
        return FastRead(header, pa.concat_tables(self.chunks), self.decoded)

    def _take(self, text: Buffer) -> bool:
        """Append `text` to pending, squeezed when the squeezer is on; False when the squeeze
        stopped (not JSON there, or a string above the limit: the general reader words it)."""
        if self.squeezer is None:
            self.pending += text
            return True
        self.squeezer.squeeze(text, self.pending)
        return not self.squeezer.stopped

    def _squeeze_pending(self) -> bool:
        """Squeeze what pending holds (it starts between two tokens), and what comes next."""
        text, self.pending = self.pending, bytearray()
        self.squeezer = squeezer()
        return self._take(text)

    def _find_array(self) -> bool | None:
        """Split off the text up to the traceEvents array: True when done, None when the
        array has not started yet, False when traceEvents is not followed by an array. The
        text searched before is not searched again."""
        key = self.pending.find(TRACE_EVENTS_KEY, self.searched)
        if key < 0:
            self.searched = max(self.searched, len(self.pending) - len(TRACE_EVENTS_KEY) + 1)
            return None
        self.searched = key
        # Squeezed text: one blank at most between two tokens.
        at = key + len(TRACE_EVENTS_KEY)
        for token in b":[":
            if at < len(self.pending) and self.pending[at] in _BLANK:
                at += 1
            if at >= len(self.pending):
                return None
            if self.pending[at] != token:
                return False
            at += 1
        self.prefix = self.pending[:at]
        del self.pending[:at]
        return True

    def _streaming(self) -> bool:
        """In the array, its text taken as it is (not squeezed, no long event waited for)."""
        return (
            self.prefix is not None and self.squeezer is None and not self.closed and not self.wait
        )

    def _feed_array(self, text: memoryview) -> bool:
        """Parse the whole events of a piece where they lie, without copying the piece: the
        event the last piece cut off (pending) is completed with a copy of this piece's head
        (`bridge` bytes), the rest is scanned in place, and what this piece cuts off is kept."""
        start = 0
        if self.pending:
            held = len(self.pending)
            self.pending += text[: self.bridge]
            consumed = self._scan(self.pending)
            if consumed is None:
                return False
            if self.closed:
                return self._after_array(self.pending[consumed:], text[self.bridge :])
            if consumed < held:  # an event longer than the bridge: the whole piece is needed
                del self.pending[:consumed]
                self.pending += text[self.bridge :]
                return self._parse()
            start = consumed - held
            self.pending = bytearray()
        rest = text[start:]
        consumed = self._scan(rest)
        if consumed is None:
            return False
        if self.closed:
            return self._after_array(rest[consumed:])
        self.pending = bytearray(rest[consumed:])
        if consumed or len(self.pending) < self.piece:
            return True
        return self._wait_longer()  # a piece's worth of text and no whole event in it

    def _after_array(self, *texts: Buffer) -> bool:
        """Squeeze the text after the array."""
        self.pending = bytearray()
        self.squeezer = squeezer()
        return all(self._take(text) for text in texts)

    def _scan(self, text: Buffer) -> int | None:
        """Parse the whole events at the start of `text` (until the array's end): the bytes
        read, or None when the scanner cannot read them."""
        readable, consumed, events, closed, wanted = self.scanner.scan(text, not self.rows)
        if not readable or wanted is None:
            return None
        texts: list[bytearray] = []
        with memoryview(text) as view:  # released at once: pending may be resized next
            for _, start, stop in wanted:
                event = bytearray(view[start:stop])
                if prune(event, event=True)[0] != PRUNED:
                    return None
                texts.append(event)
        if texts:
            # The scanner read the events: json.loads reads them too (unless one nests too
            # deeply), as one array — one call, not one per event.
            try:
                events_json = json.loads(b"[" + b",".join(texts) + b"]")
            except RecursionError:
                return None
            self.decoded.update(zip((index for index, _, _ in wanted), events_json, strict=True))
        self.rows += events
        self.closed = closed
        if self.scanner.held() >= CHUNK_TEXT:
            self.chunks.append(_complete_events(*self.scanner.columns()))
        return int(consumed)

    def _parse(self) -> bool:
        """Parse the whole events pending (until the array's end); False when the scanner
        cannot read them."""
        if self.closed:
            return True
        consumed = self._scan(self.pending)
        if consumed is None:
            return False
        del self.pending[:consumed]
        if self.closed:
            return self._squeeze_pending()  # the text after the array
        if consumed:
            self.squeezer = None
            self.wait = 0
            return True
        return self._wait_longer()

    def _wait_longer(self) -> bool:
        """No whole event in this much text: wait for twice the text, so that an event longer
        than a piece costs about twice its length to scan, not its length once per piece;
        squeezed, so that blanks do not pile up and a string above the limit ends the read."""
        if self.squeezer is None and not self._squeeze_pending():
            return False
        self.wait = 2 * len(self.pending)
        return True


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
            "ts": _numbers(length, ts, pa.int64()),
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
