"""A trace file's JSON text, as both readers take it in: a stream of pieces, gunzipped on the
way, within the limits of docs/limits.md (MAX_TRACE_BYTES for the whole text, MAX_STRING_BYTES
for one string), its padding squeezed out by _scan.c's Squeezer, and the arrays and objects that no reader
keeps blanked out by _scan.c's prune (nesting deeper than 512 levels refused).

The general reader needs the whole text at once (json.loads); `read_text` hands it the text
squeezed, so that what it holds follows the tokens of the file: blanks, however many, are kept
as one byte a run, and the text stops at a byte that no JSON can hold there (garbage: the
parser's error names that byte, and nothing after it can change the verdict). The text is UTF-8
(with or without a byte-order mark), checked over the whole file as json.loads checks it. A
parse error is located in the file as it is (line, column, byte): by squeezing the file once
more up to it, or, at the end of the text, from the counts of the first reading.
"""

from __future__ import annotations

import codecs
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import numpy as np

from perfdiag.api.limits import MAX_STRING_BYTES, MAX_TRACE_BYTES, size_text
from perfdiag.engine.kineto.json_shape import GZIP_MAGIC, INFLATE_ERRORS, TraceError, inflater
from perfdiag.engine.kineto.native import Squeezer, prune
from perfdiag.storage.regular_file import open_regular

# Bytes of text handled at once: a piece the inflater has just written is still in the core's
# L2 cache (2 MB here) when the scanner reads it: 512 KB read and scanned ~3% faster than 1 MB.
PIECE = 1 << 19
# Compressed bytes read at once (~3 MB of Kineto JSON, several pieces): the inflater copies what
# a piece leaves of a read to keep it, and 1 MB reads gunzipped 5–8% slower than 64–256 KB.
_READ = 1 << 18
GARBAGE, LONG_STRING = 1, 2  # Squeezer.stopped
PRUNED, NOT_JSON, TOO_DEEP = 0, 1, 2  # prune's status
# What bytes.rstrip() strips: a parse error past the last other byte is "the file ends early".
_BLANKS = " \t\n\r\x0b\x0c"
_BLANK_BYTES = _BLANKS.encode()


def squeezer() -> Squeezer:
    """A Squeezer with the string limit."""
    return Squeezer(MAX_STRING_BYTES)


def pieces(path: Path, size: int) -> Iterator[bytes]:
    """The file's text in pieces of at most `size` bytes, gunzipped when it is gzip. Raises
    TraceError for gzip damage, a text above MAX_TRACE_BYTES (a plain file is refused before
    it is read; a gzip one when its text passes the limit), or a file that cannot be read."""
    try:
        with open_regular(path) as fh:
            head = fh.read(2)
            fh.seek(0)
            total = 0
            if head != GZIP_MAGIC:
                if os.fstat(fh.fileno()).st_size > MAX_TRACE_BYTES:
                    raise _too_large(path, "holds")
                while text := fh.read(size):
                    total += len(text)
                    if total > MAX_TRACE_BYTES:  # the file grew while it was read
                        raise _too_large(path, "holds")
                    yield text
                return
            stream = inflater()
            while not stream.eof:
                data = b""  # b"" in: the inflater goes on with the input it holds
                if stream.needs_input and not (data := fh.read(_READ)):
                    raise TraceError(
                        f"{path}: truncated gzip data (the file ends before the stream does)"
                    )
                try:
                    text = stream.decompress(data, size)
                except INFLATE_ERRORS as exc:
                    raise TraceError(f"{path}: corrupt gzip data ({exc})") from exc
                if text:
                    total += len(text)
                    if total > MAX_TRACE_BYTES:
                        raise _too_large(path, "gunzips to")
                    yield text
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from exc


def _too_large(path: Path, verb: str) -> TraceError:
    return TraceError(
        f"{path}: {verb} more than {size_text(MAX_TRACE_BYTES)} of JSON text, the limit "
        "for one trace file (docs/limits.md)"
    )


def long_string(path: Path, at: int) -> TraceError:
    return TraceError(
        f"{path}: the JSON string at byte {at} is longer than {size_text(MAX_STRING_BYTES)}, "
        "the limit for one string (docs/limits.md)"
    )


def nested_too_deeply(path: Path) -> TraceError:
    return TraceError(f"{path}: not valid JSON: nested too deeply")


@dataclass
class Text:
    """A trace's text for the general reader: squeezed, decoded."""

    path: Path
    text: str
    # The squeeze left out bytes, or blanked some (a blanked character may have been several
    # bytes): a position is found in the file again.
    squeezed: bool
    # The squeeze stopped at garbage, and the file goes on with more than blanks after it.
    continued: bool
    end: Position | None  # the file's end, when `text` runs to it

    def where(self, pos: int) -> str:
        """A position of `text` (json's error position) as json.loads would give it for the
        file as it is."""
        if not self.squeezed:
            line = self.text.count("\n", 0, pos) + 1
            column = pos - self.text.rfind("\n", 0, pos)
            return f"line {line}, column {column}, byte {pos}"
        found = self.end if self.end is not None and pos >= len(self.text) else None
        if found is None:  # the file is squeezed again, up to that position
            found = _locate(self.path, len(self.text[:pos].encode("utf-8", "surrogatepass")))
        return f"line {found.line}, column {found.column}, byte {found.chars}"

    def ends_early(self, pos: int) -> bool:
        """Whether only blanks follow `pos` in the file: it ends before its JSON does."""
        return not self.continued and pos >= len(self.text.rstrip(_BLANKS))


class Position:
    """A place in a text, in json's terms, counted over the text before it."""

    def __init__(self) -> None:
        self.chars = 0  # characters before it
        self.lines = 0  # newlines before it
        self.line_start = 0  # the characters before its line

    def add(self, part: bytes) -> None:
        newlines = part.count(b"\n")
        if newlines:
            self.lines += newlines
            self.line_start = self.chars + _characters(part[: part.rfind(b"\n") + 1])
        self.chars += _characters(part)

    @property
    def line(self) -> int:
        return self.lines + 1

    @property
    def column(self) -> int:
        return self.chars - self.line_start + 1


def read_text(path: Path) -> Text:
    """The whole text for the general reader. Raises TraceError as `pieces` does, for text
    that is not UTF-8, and for a string above MAX_STRING_BYTES (unless the text is not JSON
    before it: then the parser names that)."""
    squeeze = squeezer()
    data = bytearray()
    utf8 = _Utf8()
    end = Position()  # a text that fails at its end (truncated, blanks only) is located so
    continued = False
    for piece in _unmarked(pieces(path, PIECE)):
        utf8.check(piece)
        end.add(piece)
        rest = memoryview(piece)
        if not squeeze.stopped:
            rest = rest[squeeze.squeeze(piece, data) :]
        if squeeze.stopped == GARBAGE and not continued:
            continued = bool(rest.tobytes().translate(None, _BLANK_BYTES))
    utf8.finish()
    if utf8.error is not None:
        reason, at = utf8.error
        raise TraceError(f"{path}: not UTF-8 text ({reason} at byte {at})")
    # What no reader keeps is blanked in place (its positions unchanged): json.loads builds
    # objects for the values the analysis reads, not for every value of the file.
    status, _, blanked = prune(data)
    if status == TOO_DEEP:
        raise nested_too_deeply(path)
    try:
        text = data.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError as exc:  # a stop in the middle of a character: its first byte
        text = data[: exc.start].decode("utf-8", "surrogatepass") + "\ufffd"
    del data
    if squeeze.stopped == LONG_STRING and not _fails_before(text, squeeze.string_kept):
        raise long_string(path, squeeze.string_at)
    return Text(
        path,
        text,
        squeezed=squeeze.kept != squeeze.read or blanked > 0,
        continued=continued,
        end=None if squeeze.stopped else end,
    )


def _fails_before(text: str, offset: int) -> bool:
    """Whether json.loads fails on `text` before its byte `offset` (a string the text ends
    in): that error comes first in the file."""
    start = len(text.encode("utf-8", "surrogatepass")[:offset].decode("utf-8", "surrogatepass"))
    try:
        json.loads(text, parse_float=Decimal)
    except json.JSONDecodeError as exc:
        return exc.pos < start
    except RecursionError:
        return True
    return False


def _unmarked(parts: Iterator[bytes]) -> Iterator[bytes]:
    """`parts` without a leading UTF-8 byte-order mark (json.loads reads bytes so)."""
    head = b""
    for part in parts:
        head += part
        if len(head) >= len(codecs.BOM_UTF8):
            yield head.removeprefix(codecs.BOM_UTF8)
            yield from parts
            return
    if head:
        yield head


class _Utf8:
    """Checks that the pieces are UTF-8 as json.loads decodes bytes (encoded surrogates
    pass); keeps the first error: (reason, byte offset)."""

    def __init__(self) -> None:
        self.decoder = codecs.getincrementaldecoder("utf-8")("surrogatepass")
        self.offset = 0  # bytes given to the decoder
        self.error: tuple[str, int] | None = None

    def check(self, piece: bytes, final: bool = False) -> None:
        if self.error is not None:
            return
        held = len(self.decoder.getstate()[0])  # the start of a character cut by the piece
        try:
            self.decoder.decode(piece, final)
        except UnicodeDecodeError as exc:
            self.error = (exc.reason, self.offset - held + exc.start)
        self.offset += len(piece)

    def finish(self) -> None:
        self.check(b"", final=True)


def _locate(path: Path, offset: int) -> Position:
    """The place in the file of the squeezed text's byte `offset`."""
    squeeze = squeezer()
    position = Position()
    for piece in _unmarked(pieces(path, PIECE)):
        used = squeeze.squeeze(piece, None, offset)
        position.add(piece[:used])
        if used < len(piece) or squeeze.stopped:
            break
    return position


def _characters(data: bytes) -> int:
    """UTF-8 characters in `data`: the bytes that are not continuation bytes."""
    if data.isascii():
        return len(data)
    codes = np.frombuffer(data, np.uint8)
    return len(data) - int(np.count_nonzero((codes & 0xC0) == 0x80))
