"""The fast JSON reader: the `traceEvents` array rewritten in place into one event per line and
parsed by pyarrow's multi-threaded JSON reader against an explicit schema (unknown fields are
skipped in C++). Returns None whenever the file needs the general reader instead.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.json as pj

from perfdiag.kineto.json_shape import JSON_SCHEMA, TRACE_EVENTS_KEY

Bytes = npt.NDArray[np.uint8]

_NEWLINE, _SPACE, _COMMA, _TAB, _CR = 10, 32, 44, 9, 13
_OPEN, _CLOSE = 123, 125  # { }
_MAX_INDENT = 64  # blanks looked at between the events of a pretty-printed file
_LABELS = (b'"pid": "', b'"tid": "')
_LABEL_TAIL = 1 << 16  # Kineto writes its label pids ("Spans") among the last events
_LABEL_PATTERN = re.compile(rb'"[pt]id": "')
_NOT_BLANK = re.compile(rb"\S")
_CHUNK = 1 << 22  # bytes per vectorized pass: bounds the temporaries
_BLOCK = 1 << 22


@dataclass
class Prepared:
    """The top-level fields and the event lines of a trace, ready to parse."""

    header: dict[str, Any]
    text: Bytes
    ends: npt.NDArray[np.intp]  # the newline ending each event line but the last


def prepare(data: bytes) -> Prepared | None:
    """Split off the top-level fields and rewrite the events into lines (None: this file needs
    the general reader). The result does not refer to `data`, which the caller may drop."""
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
    start, stop = lb + 1, rb
    text, ends = _as_event_lines(data, start, stop)
    _rename_labels(text, data, max(start, stop - _LABEL_TAIL), stop, start)
    return Prepared(header, text, ends)


def read_prepared(
    prepared: Prepared,
) -> tuple[dict[str, Any], pa.Table, Callable[[int], Any]] | None:
    """(top-level fields, JSON_SCHEMA table, decoder of the i-th event), or None."""
    header, text = prepared.header, prepared.text
    if _NOT_BLANK.search(text.data) is None:
        return header, JSON_SCHEMA.empty_table(), _no_event
    table = _parse(text)
    if table is None:  # perhaps labels before the tail: rename them all and try once more
        for match in _LABEL_PATTERN.finditer(text.data):
            text[match.start() + 3] = ord("s")
        table = _parse(text)
    if table is None:
        return None
    if len(prepared.ends) + 1 != table.num_rows:
        return None  # not one event per line: row i would not be line i
    return header, table, _line_decoder(text, prepared.ends)


def read_fast(data: bytes) -> tuple[dict[str, Any], pa.Table, Callable[[int], Any]] | None:
    """prepare + read_prepared."""
    prepared = prepare(data)
    return read_prepared(prepared) if prepared is not None else None


def _no_event(index: int) -> Any:
    return None


def _parse(text: Bytes) -> pa.Table | None:
    options = pj.ParseOptions(explicit_schema=JSON_SCHEMA, unexpected_field_behavior="ignore")
    try:
        return pj.read_json(
            pa.BufferReader(pa.py_buffer(text)),
            parse_options=options,
            read_options=pj.ReadOptions(block_size=_BLOCK),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def _line_decoder(text: Bytes, ends: npt.NDArray[np.intp]) -> Callable[[int], Any]:
    starts = np.concatenate([[0], ends + 1])
    stops = np.concatenate([ends, [len(text)]])

    def decode(index: int) -> Any:
        try:
            return json.loads(text[starts[index] : stops[index]].tobytes())
        except ValueError:
            return None

    return decode


def _as_event_lines(data: bytes, start: int, stop: int) -> tuple[Bytes, npt.NDArray[np.intp]]:
    """data[start:stop] (the inside of the traceEvents array) rewritten byte for byte into one
    event per line: raw newlines are whitespace in JSON, so they become spaces, and the commas
    between events ('}' ws* ',' ws* '{') become the newlines (returned too)."""
    text: Bytes = np.frombuffer(data, dtype=np.uint8, count=stop - start, offset=start).copy()
    found = []
    for lo in range(0, len(text), _CHUNK):
        part = text[lo : lo + _CHUNK]
        found.append(np.flatnonzero(part == _COMMA) + lo)
        np.copyto(part, _SPACE, where=part == _NEWLINE)
    commas = np.concatenate(found) if found else np.zeros(0, dtype=np.intp)
    commas = commas[(commas > 0) & (text[np.maximum(commas - 1, 0)] == _CLOSE)]
    following = np.zeros(len(commas), dtype=np.uint8)  # the next non-blank byte
    pending = np.arange(len(commas))
    last = len(text) - 1
    for step in range(1, _MAX_INDENT):
        if not len(pending):
            break
        byte = text[np.minimum(commas[pending] + step, last)]
        blank = (byte == _SPACE) | (byte == _TAB) | (byte == _CR)
        following[pending[~blank]] = byte[~blank]
        pending = pending[blank]
    separators = commas[following == _OPEN]
    text[separators] = _NEWLINE
    return text, separators


def _rename_labels(text: Bytes, data: bytes, lo: int, hi: int, origin: int) -> None:
    """Rename "pid": "Spans" to "pis": "Spans" (and tid) between data offsets lo and hi."""
    for label in _LABELS:
        pos = data.find(label, lo, hi)
        while pos >= 0:
            text[pos - origin + 3] = ord("s")
            pos = data.find(label, pos + 1, hi)


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
