"""The parts of the C scanner (_scan.c) that the general reader needs, in Python: for an install
without a C compiler, where the extension was not built (perfdiag.engine.kineto.native).

`Squeezer` is _scan.c's, step for step (the same text kept, the same stops, the same counts):
a stretch of whole tokens, blanks and strings is squeezed at once with numpy (the quotes that
open and close strings found from the parity of the backslashes before them), the rest — a
string over a piece's end, garbage, a cap — byte run by byte run as in C. `prune` checks the nesting only (status 2 beyond
PRUNE_DEPTH levels) and blanks nothing: json.loads then builds every value of the file, which
the readers ignore as they ignore blanked ones — more memory and time, the same table.
"""

from __future__ import annotations

import re

import numpy as np

PRUNE_DEPTH = 512
GOING, STOP_GARBAGE, STOP_LONG = 0, 1, 2

_TOKEN = frozenset(b"{}[],:0123456789+-.eEaflnrstuyINi")  # json's tokens, as in _scan.c
_BLANK = frozenset(b" \t\n\r")
_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_STRING_RUN = re.compile(rb'[^"\\]*')
_TOKEN_RUN = re.compile(rb"[{}\[\],:0-9+\-.eEaflnrstuyINi]*")
_BLANK_RUN = re.compile(rb"[ \t\n\r]*")
_STRINGS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_KIND = np.full(256, 3, dtype=np.uint8)  # 0 token, 1 blank, 2 quote, 3 anything else
_KIND[list(_TOKEN)] = 0
_KIND[list(_BLANK)] = 1
_KIND[_QUOTE] = 2
_BRACKETS = b"[]{}"
_NOT_BRACKETS = bytes(c for c in range(256) if c not in _BRACKETS)


class Squeezer:
    """JSON text without its padding: blank runs kept as their first byte (_scan.c)."""

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError("Squeezer: a negative limit")
        self.limit = limit
        self.in_string = self.escape = self.blank = False
        self.stopped = GOING
        self.length = 0  # bytes of the current string so far
        self.read = self.kept = 0
        self.string_at = self.string_kept = -1

    def squeeze(self, data: bytes | bytearray | memoryview, into: bytearray | None,
                upto: int = -1) -> int:  # fmt: skip
        s = bytes(data)
        n = cap = len(s)
        if upto >= 0:
            cap = min(cap, max(upto - self.kept, 0))
        out: list[bytes] = []
        i = k = 0
        while i < n and self.stopped == GOING:
            if not self.in_string and upto < 0 and self.limit >= n:
                # No cap, and no string of this text can pass the limit: whole stretches at once.
                end, kept, opened = _bulk(s, i, self.blank)
                if end > i:
                    if opened is not None:
                        self.string_at = self.read + i + opened[0]
                        self.string_kept = self.kept + k + opened[1]
                    out.append(kept)
                    k += len(kept)
                    self.blank = s[end - 1] in _BLANK
                    i = end
                    continue
            if self.in_string:
                j = _STRING_RUN.match(s, i + (1 if self.escape else 0)).end()  # type: ignore[union-attr]
                run = j - i
                if run > self.limit - self.length:
                    self.stopped = STOP_LONG
                    break
                run = min(run, cap - k)
                out.append(s[i : i + run])
                k += run
                self.length += run
                if run:
                    self.escape = False
                i += run
                if i < j or i == n or k == cap:
                    break
                if s[i] == _BACKSLASH:
                    if self.length + 1 > self.limit:
                        self.stopped = STOP_LONG
                        break
                    self.length += 1
                    self.escape = True
                else:
                    self.in_string = False
                out.append(s[i : i + 1])
                k += 1
                i += 1
                continue
            c = s[i]
            if c in _BLANK:
                if not self.blank:
                    if k == cap:
                        break
                    out.append(s[i : i + 1])
                    k += 1
                    self.blank = True
                i = _BLANK_RUN.match(s, i + 1).end()  # type: ignore[union-attr]
                continue
            if k == cap:
                break
            self.blank = False
            if c in _TOKEN:
                j = min(_TOKEN_RUN.match(s, i + 1).end(), i + (cap - k))  # type: ignore[union-attr]
                out.append(s[i:j])
                k += j - i
                i = j
            elif c == _QUOTE:
                self.string_at = self.read + i
                self.string_kept = self.kept + k
                out.append(b'"')
                k += 1
                self.in_string = True
                self.escape = False
                self.length = 0
                i += 1
            else:
                out.append(s[i : i + 1])
                k += 1
                i += 1
                self.stopped = STOP_GARBAGE
        self.read += i
        self.kept += k
        if into is not None:
            into += b"".join(out)
        return i


def _bulk(s: bytes, start: int, blank: bool) -> tuple[int, bytes, tuple[int, int] | None]:
    """Squeeze s[start:end], the longest stretch from `start` (outside strings) of whole
    tokens, blanks and strings: (end, the bytes kept, the offsets — read and kept, from
    `start` — of its last string's opening quote, None when it has none). `blank`: the byte
    before was a blank kept."""
    text = np.frombuffer(s, dtype=np.uint8, offset=start)
    kind = _KIND[text]
    quotes = np.flatnonzero(kind == 2)
    if len(quotes):
        # A quote after an odd run of backslashes is escaped: it neither opens nor closes.
        position = np.arange(len(text))
        last_other = np.maximum.accumulate(np.where(text != _BACKSLASH, position, -1))
        before = np.where(quotes > 0, quotes - 1 - last_other[np.maximum(quotes - 1, 0)], 0)
        quotes = quotes[before % 2 == 0]
    marks = np.zeros(len(text), dtype=np.int64)
    marks[quotes] = 1
    inside = (np.cumsum(marks) % 2).astype(bool)  # from an opening quote to its closing one
    bad = np.flatnonzero((kind == 3) & ~inside)  # garbage (backslashes too) outside strings
    end = int(bad[0]) if len(bad) else len(text)
    quotes = quotes[quotes < end]
    if len(quotes) % 2:
        end = int(quotes[-1])  # a string that does not end here: byte run by byte run
        quotes = quotes[:-1]
    if end == 0:
        return start, b"", None
    kind, inside = kind[:end], inside[:end]
    blanks = (kind == 1) & ~inside
    keep = ~blanks
    keep[1:] |= blanks[1:] & ~blanks[:-1]  # the first blank of a run
    keep[0] |= bool(blanks[0]) and not blank
    kept = text[:end][keep].tobytes()
    opened = None
    if len(quotes):
        last = int(quotes[-2])  # the last string's opening quote
        opened = (last, int(np.count_nonzero(keep[:last])))
    return start + end, kept, opened


def prune(text: bytearray, event: bool = False) -> tuple[int, int, int]:
    """(2, 0, 0) when arrays and objects nest deeper than PRUNE_DEPTH outside strings, else
    (0, 0, 0): nothing blanked, the text left for json.loads to judge."""
    brackets = _STRINGS.sub(b"", text).translate(None, _NOT_BRACKETS)
    if not brackets:
        return 0, 0, 0
    values = np.frombuffer(brackets, dtype=np.uint8)
    steps = np.where((values == ord("[")) | (values == ord("{")), 1, -1)
    if int(np.cumsum(steps).max()) > PRUNE_DEPTH:
        return 2, 0, 0
    return 0, 0, 0
