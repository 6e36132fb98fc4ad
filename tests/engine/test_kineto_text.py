"""The text both Kineto readers take in (perfdiag.engine.kineto.text): streamed within the limits of
docs/limits.md, squeezed (blank runs kept as one byte, the text ended at garbage), and still
worded by the general reader as json.loads words the file as it is."""

from __future__ import annotations

import codecs
import gzip
import json
import tempfile
import time
from decimal import Decimal
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfdiag.api.limits import MAX_TRACE_BYTES
from perfdiag.engine.kineto import TraceError, load_trace, text
from perfdiag.engine.kineto._scan import Squeezer
from tests.engine.test_kineto_malformed import JSON, _outcome, _valid_trace

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _squeezed(data: bytes, piece: int, limit: int = 1 << 20) -> tuple[bytes, int]:
    squeezer = Squeezer(limit)
    out = bytearray()
    for at in range(0, len(data), piece):
        used = squeezer.squeeze(data[at : at + piece], out)
        if squeezer.stopped:
            break
        assert used == len(data[at : at + piece])
    return bytes(out), squeezer.stopped


SEPARATORS = st.sampled_from([(",", ":"), (", ", ": "), (" ,\n\n ", " \t:\r\n"), (",\t\t", ":  ")])


@SETTINGS
@given(
    document=JSON,
    indent=st.sampled_from([None, 0, 1, 4]),
    separators=SEPARATORS,
    piece=st.integers(1, 40),
)
def test_squeezing_keeps_the_value_and_one_blank_a_run(
    document: Any, indent: int | None, separators: tuple[str, str], piece: int
) -> None:
    data = json.dumps(document, indent=indent, separators=separators, ensure_ascii=False).encode()
    data = b"  \n" + data + b"\n\n"
    squeezed, stopped = _squeezed(data, piece)
    assert stopped == 0
    assert json.loads(squeezed) == document
    assert squeezed == _squeezed(data, len(data))[0]  # the same in any pieces
    assert _squeezed(squeezed, len(squeezed))[0] == squeezed  # no blank run is left


@pytest.mark.parametrize("garbage", [b"\x00", b"\xff", b"x", b"\x0b", b"\xc3\xa9"])
def test_squeezing_ends_at_a_byte_json_cannot_hold_there(garbage: bytes) -> None:
    data = b'{"a \\" \x00 \xc3\xa9": [1,   2]  ' + garbage + b" \x00" * 100
    squeezed, stopped = _squeezed(data, 3)
    assert stopped == 1
    assert squeezed == b'{"a \\" \x00 \xc3\xa9": [1, 2] ' + garbage[:1]


def test_a_string_is_measured_between_its_quotes_as_written() -> None:
    fits = b'{"' + b"a" * 98 + b'\\"": 1}'  # 100 bytes between the quotes
    assert _squeezed(fits, 7, limit=100) == (fits, 0)
    assert _squeezed(fits.replace(b"a", b"aa", 1), 7, limit=100)[1] == 2


# --- the general reader's errors: those of json.loads on the file as it is -----------------------


def _reference(data: bytes) -> str | None:
    """What the general reader says of a file that is not valid JSON, in words json.loads
    gives for the text as it is (UTF-8, a byte-order mark allowed); None for valid JSON."""
    try:
        decoded = data.removeprefix(codecs.BOM_UTF8).decode("utf-8", "surrogatepass")
    except UnicodeDecodeError as exc:
        return f"not UTF-8 text ({exc.reason} at byte {exc.start})"
    try:
        json.loads(decoded, parse_float=Decimal)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno}, column {exc.colno}, byte {exc.pos}"
        if exc.pos >= len(decoded.rstrip(" \t\n\r\x0b\x0c")):
            return f"not valid JSON: the file ends early ({where})"
        return f"not valid JSON: {exc.msg} ({where})"
    except RecursionError:
        return "not valid JSON: nested too deeply"
    return None


def _damaged(data: st.DataObject, text_: bytes) -> bytes:
    """`text_` with a few bytes flipped, deleted or inserted, blank runs among them."""
    changed = bytearray(text_)
    alphabet = [*b'{}[],:"\\0-.eNx\x00\x0b\xff\xed\xa0', b"\xc3\xa9", b" " * 9, b"\n\t\r\n"]
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(changed) - 1))
        action = data.draw(st.sampled_from(["flip", "delete", "insert"]))
        insert = data.draw(st.sampled_from(alphabet))
        piece = bytes([insert]) if isinstance(insert, int) else insert
        if action == "flip":
            changed[at : at + 1] = piece
        elif action == "delete":
            del changed[at]
        else:
            changed[at:at] = piece
    return bytes(changed)


@SETTINGS
@given(
    data=st.data(),
    indent=st.sampled_from([None, 2, 9]),
    piece=st.sampled_from([1, 5, 64, 1 << 20]),
    gzipped=st.booleans(),
    mark=st.booleans(),
)
def test_the_general_readers_errors_name_the_file_as_it_is(
    data: st.DataObject, indent: int | None, piece: int, gzipped: bool, mark: bool
) -> None:
    source = json.dumps(_valid_trace(), indent=indent).encode() + b"\n \n"
    damaged = (codecs.BOM_UTF8 if mark else b"") + _damaged(data, source)
    if data.draw(st.booleans()):  # cut short
        damaged = damaged[: data.draw(st.integers(0, len(damaged)))]
    expected = _reference(damaged)
    with tempfile.TemporaryDirectory() as folder, mock.patch.object(text, "PIECE", piece):
        path = Path(folder) / ("t.json.gz" if gzipped else "t.json")
        path.write_bytes(gzip.compress(damaged) if gzipped else damaged)
        general, fast = _outcome(path, False), _outcome(path, True)
    if expected is None:  # valid JSON: read, or refused for what it holds
        assert not isinstance(general, str) or "not valid JSON" not in general, general
    else:
        assert general == f"{path}: {expected}"
    if isinstance(general, str) or isinstance(fast, str):
        assert fast == general
    else:
        assert fast.equals(general)


def test_a_byte_order_mark_is_read_as_json_loads_reads_it(tmp_path: Path) -> None:
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(_valid_trace(), indent=2))
    marked = tmp_path / "marked.json"
    marked.write_bytes(codecs.BOM_UTF8 + plain.read_bytes())
    assert load_trace(marked).events.equals(load_trace(plain).events)


# --- the limits -----------------------------------------------------------------------------------


def _with_string(where: str, value: str) -> bytes:
    """A valid trace with `value` as a string somewhere."""
    trace = _valid_trace()
    if where == "header":
        trace = {"traceName": value, **trace}
    elif where == "name":
        trace["traceEvents"][1]["name"] = value
    elif where == "argument":
        trace["traceEvents"][2]["args"]["Process Group Name"] = value
    elif where == "key":
        trace["traceEvents"][1]["args"][value] = 1
    else:  # after the array
        trace["trailer"] = value
    return json.dumps(trace, indent=1, ensure_ascii=False).encode()


@pytest.mark.parametrize("where", ["header", "name", "argument", "key", "after the array"])
@pytest.mark.parametrize("piece", [7, 1 << 20])
def test_a_string_above_the_limit_skips_the_trace_in_both_readers(
    where: str, piece: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(text, "MAX_STRING_BYTES", 1000)
    path = tmp_path / "t.json"
    fits = "é" * 10 + "a" * 978 + '"'  # 1,000 bytes between the quotes, as written (\")
    path.write_bytes(_with_string(where, fits))
    assert load_trace(path, piece=piece).events.equals(load_trace(path, fast=False).events)
    data = _with_string(where, fits + "a")
    path.write_bytes(data)
    at = data.index(b'"\xc3\xa9')
    message = f"{path}: the JSON string at byte {at} is longer than 1,000 bytes"
    for fast in (True, False):
        with pytest.raises(TraceError) as caught:
            load_trace(path, fast=fast, piece=piece)
        assert str(caught.value).startswith(message), str(caught.value)


def test_a_json_error_before_a_long_string_is_named_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(text, "MAX_STRING_BYTES", 1000)
    path = tmp_path / "t.json"
    path.write_bytes(b'{"a": [1 2], "traceEvents": [], "b": "' + b"a" * 5000 + b'"}')
    for fast in (True, False):
        with pytest.raises(
            TraceError, match=r"Expecting ',' delimiter \(line 1, column 10, byte 9"
        ):
            load_trace(path, fast=fast)


@pytest.mark.parametrize("gzipped", [False, True])
def test_a_text_above_the_size_limit_skips_the_trace_in_both_readers(
    gzipped: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(text, "MAX_TRACE_BYTES", 10_000)
    data = json.dumps(_valid_trace()).encode()[:-1] + b', "pad": "'
    data += b"a" * (10_000 - len(data) - 2) + b'"}'
    assert len(data) == 10_000
    path = tmp_path / ("t.json.gz" if gzipped else "t.json")
    path.write_bytes(gzip.compress(data) if gzipped else data)
    assert load_trace(path).events.equals(load_trace(path, fast=False).events)
    data = data[:-2] + b'a"}'
    path.write_bytes(gzip.compress(data) if gzipped else data)
    verb = "gunzips to" if gzipped else "holds"
    for fast in (True, False):
        with pytest.raises(TraceError) as caught:
            load_trace(path, fast=fast, piece=1000)
        assert str(caught.value) == (
            f"{path}: {verb} more than 10,000 bytes of JSON text, the limit for one trace "
            "file (docs/limits.md)"
        )


def test_a_plain_file_above_the_size_limit_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    with path.open("wb") as fh:
        fh.truncate(MAX_TRACE_BYTES + 1)  # sparse
    start = time.monotonic()
    for fast in (True, False):
        with pytest.raises(TraceError, match="holds more than 4 GiB of JSON text"):
            load_trace(path, fast=fast)
    assert time.monotonic() - start < 5


def test_the_text_before_the_array_is_searched_once(tmp_path: Path) -> None:
    # 16 MB of header in pieces of 1 KiB: searching the whole text again for each piece would
    # examine it 16,000 times.
    path = tmp_path / "t.json"
    trace = json.dumps(_valid_trace())
    path.write_bytes(b'{"k": [' + b"1," * (8 << 20) + b"1]," + trace[1:].encode())
    start = time.monotonic()
    raw = load_trace(path, piece=1 << 10)
    assert raw.fast and raw.events.num_rows == 4
    assert time.monotonic() - start < 15


# --- values no reader keeps are not decoded ---------------------------------------------------


def _dense(path: Path, where: str, count: int, *, general: bool = False) -> None:
    """A valid trace holding `count` zeros in one array: a top-level field, or an event's args;
    `general`: with a timestamp written as a string, which only the general reader reads."""
    trace = _valid_trace()
    if general:
        trace["traceEvents"][1]["ts"] = "110.25"
    if where == "top":
        trace["pad"] = "@"
    else:
        trace["traceEvents"][1]["args"]["pad"] = "@"
    head, tail = json.dumps(trace).split('"@"')
    path.write_bytes(head.encode() + b"[" + b"0," * count + b"0]" + tail.encode())


@pytest.mark.parametrize("where", ["top", "args"])
@pytest.mark.parametrize("general", [False, True])
def test_a_token_dense_array_costs_its_text_not_a_value_each(
    tmp_path: Path, where: str, general: bool
) -> None:
    import tracemalloc

    count = 5_000_000  # 10 MB of text; json.loads would hold 40 MB of pointers for it
    _dense(tmp_path / "dense.json", where, count, general=general)
    _dense(tmp_path / "plain.json", where, 0, general=general)
    tracemalloc.start()
    try:
        dense = load_trace(tmp_path / "dense.json", fast=not general)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert dense.fast is not general
    assert peak < 3.5 * 2 * count, peak  # the text (and its copies), never a value a zero
    plain = load_trace(tmp_path / "plain.json", fast=not general)
    assert dense.events.equals(plain.events)
    if where == "top":
        assert dense.header["pad"] == []  # read as empty: nothing reads it


def test_the_values_read_are_kept_and_a_text_that_is_not_json_fails_where_it_did(
    tmp_path: Path,
) -> None:
    trace = _valid_trace()
    trace["traceEvents"][2]["args"]["Process Group Ranks"] = [0, 1]  # a collective's: kept
    trace["distributedInfo"]["hosts"] = ["a", "b"]
    path = tmp_path / "rank-1.json"
    path.write_text(json.dumps(trace))
    for fast in (True, False):
        raw = load_trace(path, fast=fast)
        nccl = raw.events["name"].to_pylist().index("ncclDevKernel_AllReduce_Sum_f32")
        assert raw.events["pg_ranks"][nccl].as_py() == "[0, 1]"
        assert raw.header["distributedInfo"] == {"rank": 1, "world_size": 2, "hosts": []}
    # A blanked value's characters may have been several bytes: positions are the file's.
    path.write_text('{"pad": ["é", "é"], "traceEvents": [] x}')
    with pytest.raises(TraceError, match=r"Expecting ',' delimiter \(line 1, column 39, byte 38\)"):
        load_trace(path, fast=False)


def test_nesting_deeper_than_512_levels_is_refused_by_both_readers(tmp_path: Path) -> None:
    for depth, refused in ((511, False), (513, True)):
        trace = json.dumps(_valid_trace())
        path = tmp_path / f"deep-{depth}.json"
        path.write_text(trace[:-1] + ', "deep": ' + "[" * depth + "]" * depth + "}")
        for fast in (True, False):
            if refused:
                with pytest.raises(TraceError, match="not valid JSON: nested too deeply"):
                    load_trace(path, fast=fast)
            else:
                assert load_trace(path, fast=fast).events.num_rows
