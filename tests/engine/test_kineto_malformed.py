"""Malformed Kineto input: a TraceError that names the file and the problem, never a crash.

The explicit corpus (tests/engine/corpus/) pins the messages; hypothesis explores the space
around it (truncations, random JSON shapes, random event fields, byte mutations).
"""

from __future__ import annotations

import gzip
import json
import tempfile
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfdiag.engine.kineto import TraceError, load_trace, read_kineto

CORPUS = Path(__file__).resolve().parent / "corpus"

EXPECTED = {
    "corrupt.json.gz": "corrupt gzip data",
    "truncated.json.gz": "truncated gzip data",
    "not_gzip.json.gz": "not valid JSON",
    "empty.json": "not valid JSON: the file ends early",
    "not_json.json": "not valid JSON: Expecting value (line 1, column 1, byte 0)",
    "truncated_json.json": "not valid JSON: Unterminated string",
    "top_level_array.json": "the top level is a JSON array, expected an object with 'traceEvents'",
    "no_trace_events.json": "no 'traceEvents' field",
    "trace_events_object.json": "'traceEvents' is a JSON object, expected an array",
    "event_not_object.json": "traceEvents[0] is a JSON number, expected an object",
    "missing_dur.json": "traceEvents[0] ('aten::mm') has no duration ('dur')",
    "missing_ts.json": "traceEvents[0] ('aten::mm') has no timestamp ('ts')",
    "missing_name.json": "traceEvents[0] has no name",
    "missing_pid.json": "traceEvents[0] ('aten::mm') has no 'pid'",
    "negative_dur.json": "traceEvents[0] ('aten::mm') has a negative duration (-5.0 µs)",
    "string_ts.json": "traceEvents[0] field 'ts' is a JSON string, expected a number",
    "huge_ts.json": "traceEvents[0] field 'ts' is out of range",
    "no_rank.json": "cannot tell the rank",
    "missing_tid.json": "traceEvents[0] ('aten::mm') has no 'tid'",
    "string_dur.json": "traceEvents[0] field 'dur' is a JSON string, expected a number",
    "name_not_string.json": "traceEvents[0] field 'name' is a JSON number, expected a string",
    "trace_events_null.json": "no 'traceEvents' field",
    # Larger than one piece of the fast reader (the damage is in a later piece).
    "negative_dur_late.json.gz": "traceEvents[20000] ('aten::mm') has a negative duration (-2.5 µs)",
    "truncated_late.json.gz": "truncated gzip data",
}


def test_corpus_is_complete() -> None:
    assert sorted(p.name for p in CORPUS.iterdir()) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_corpus_sample_gives_a_clear_error(name: str) -> None:
    path = CORPUS / name
    with pytest.raises(TraceError) as caught:
        read_kineto(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: "), message
    assert EXPECTED[name] in message, message


def test_a_rank_given_by_the_caller_or_the_file_name_is_enough(tmp_path: Path) -> None:
    text = (CORPUS / "no_rank.json").read_text()
    assert read_kineto(CORPUS / "no_rank.json", rank=5)[1].rank == 5
    named = tmp_path / "rank-3.Jul_15_10_52_41.1074.pt.trace.json"
    named.write_text(text)
    assert read_kineto(named)[1].rank == 3


def _valid_trace() -> dict[str, Any]:
    return {
        "schemaVersion": 1,
        "distributedInfo": {"rank": 1, "world_size": 2},
        "traceEvents": [
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": "ProfilerStep#7",
                "pid": 5,
                "tid": 5,
                "ts": 100.0,
                "dur": 50.5,
            },
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "aten::mm",
                "pid": 5,
                "tid": 5,
                "ts": 110.25,
                "dur": 20,
                "args": {"External id": 3},
            },
            {
                "ph": "X",
                "cat": "kernel",
                "name": "ncclDevKernel_AllReduce_Sum_f32",
                "pid": 0,
                "tid": 7,
                "ts": 120,
                "dur": 15,
                "args": {
                    "device": 0,
                    "stream": 7,
                    "correlation": 9,
                    "Collective name": "allreduce",
                    "In msg nelems": 1024,
                    "dtype": "Float",
                    "Group size": 2,
                    "Process Group Name": "0",
                },
            },
            {
                "ph": "X",
                "cat": "Trace",
                "name": "PyTorch Profiler (0)",
                "pid": "Spans",
                "tid": "PyTorch Profiler",
                "ts": 90,
                "dur": 100,
            },
            {"ph": "i", "s": "g", "name": "Record Window End", "pid": "", "tid": "", "ts": 200},
        ],
    }


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _read(blob: bytes, suffix: str = ".json") -> Any:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"rank-0{suffix}"
        path.write_bytes(blob)
        try:
            return read_kineto(path)
        except TraceError as exc:
            assert str(exc).startswith(f"{path}: ")
            return exc


@SETTINGS
@given(cut=st.floats(min_value=0.0, max_value=0.999))
def test_any_truncated_gzip_is_a_trace_error(cut: float) -> None:
    blob = gzip.compress(json.dumps(_valid_trace(), indent=2).encode())
    result = _read(blob[: int(len(blob) * cut)], ".json.gz")
    assert isinstance(result, TraceError)


@SETTINGS
@given(cut=st.integers(min_value=0, max_value=10_000))
def test_any_truncated_json_is_a_trace_error(cut: int) -> None:
    text = json.dumps(_valid_trace(), indent=2).encode()
    cut = cut % len(text.rstrip())
    result = _read(text[:cut])
    assert isinstance(result, TraceError)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@SETTINGS
@given(document=JSON)
def test_any_json_shape_is_read_or_refused_clearly(document: Any) -> None:
    _read(json.dumps(document).encode())


FIELD_VALUES = (
    st.none()
    | st.integers(-5, 10**6)
    | st.floats(-10, 1e6)
    | st.text(max_size=6)
    | st.lists(st.integers(), max_size=2)
)


@SETTINGS
@given(
    events=st.lists(
        st.fixed_dictionaries(
            {},
            optional={
                "ph": st.sampled_from(["X", "i", "M", "s", 3]),
                "cat": st.sampled_from(["cpu_op", "kernel", "user_annotation", "python_function"])
                | FIELD_VALUES,
                "name": st.sampled_from(["aten::mm", "ProfilerStep#3", "gloo:all_reduce"])
                | FIELD_VALUES,
                "pid": FIELD_VALUES,
                "tid": FIELD_VALUES,
                "ts": FIELD_VALUES,
                "dur": FIELD_VALUES,
                "args": FIELD_VALUES
                | st.dictionaries(
                    st.sampled_from(
                        ["device", "stream", "Collective name", "In msg nelems", "dtype"]
                    ),
                    FIELD_VALUES,
                ),
            },
        ),
        max_size=6,
    ),
    indent=st.sampled_from([None, 2]),
)
def test_random_event_fields_are_read_or_refused_clearly(
    events: list[dict[str, Any]], indent: int | None
) -> None:
    result = _read(
        json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": events}, indent=indent).encode()
    )
    if isinstance(result, tuple):
        table, meta = result
        assert table.num_rows <= len(events)
        assert all(d >= 0 for d in table["dur_ns"].to_pylist())
        assert meta.window.steps >= 1


@SETTINGS
@given(data=st.data())
def test_byte_mutations_are_read_or_refused_clearly(data: st.DataObject) -> None:
    text = json.dumps(_valid_trace(), indent=2).encode()
    _read(_mutated(data, text, b'{}[],:"\n 0-.x\\', 4))


def _mutated(data: st.DataObject, text: bytes, alphabet: bytes, most: int) -> bytes:
    """`text` with 1 to `most` bytes flipped, deleted or inserted (bytes of `alphabet`)."""
    changed = bytearray(text)
    for _ in range(data.draw(st.integers(1, most))):
        at = data.draw(st.integers(0, len(changed) - 1))
        action = data.draw(st.sampled_from(["flip", "delete", "insert"]))
        byte = data.draw(st.sampled_from(list(alphabet)))
        if action == "flip":
            changed[at] = byte
        elif action == "delete":
            del changed[at]
        else:
            changed.insert(at, byte)
    return bytes(changed)


def _outcome(path: Path, fast: bool) -> Any:
    """The table a reader gives, or the error it raises (in words)."""
    try:
        raw = load_trace(path, fast=fast)
    except (TraceError, UnicodeEncodeError) as exc:
        return str(exc)
    return raw.events


@SETTINGS
@given(data=st.data(), indent=st.sampled_from([None, 2]))
def test_byte_mutations_get_one_answer_from_both_readers(
    data: st.DataObject, indent: int | None
) -> None:
    # The scanner reads only what json.loads reads the same way: whatever the bytes, the
    # fast path gives the general reader's table or its error.
    trace = _valid_trace()
    trace["traceEvents"][1]["args"].update(correlation=7, stream=-2, device=0)
    text = json.dumps(trace, indent=indent).encode()
    alphabet = b'{}[],:"\\\n\t 019-.eEux\xc3\xa9\xed\xff\x00'
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "t.json"
        path.write_bytes(_mutated(data, text, alphabet, 3))
        fast, general = _outcome(path, True), _outcome(path, False)
    if isinstance(general, str) or isinstance(fast, str):
        assert fast == general
    else:
        assert fast.equals(general), (fast.to_pylist(), general.to_pylist())


def _random_valid_events() -> st.SearchStrategy[list[dict[str, Any]]]:
    number = st.decimals(
        min_value=0, max_value=10**13, places=3, allow_nan=False, allow_infinity=False
    )
    event = st.fixed_dictionaries(
        {
            "ph": st.just("X"),
            "cat": st.sampled_from(["cpu_op", "kernel", "user_annotation", "gpu_memcpy"]),
            "name": st.sampled_from(["gloo:all_reduce", "ncclKernel_AllReduce"])
            | st.text(min_size=1, max_size=10),
            "pid": st.integers(0, 2**40) | st.sampled_from(["Spans", "stream 7"]),
            "tid": st.integers(0, 2**40) | st.sampled_from(["Trace", "stream 3"]),
            "ts": number,
            "dur": st.decimals(
                min_value=0, max_value=10**6, places=3, allow_nan=False, allow_infinity=False
            ),
        },
        optional={
            "args": st.fixed_dictionaries(
                {},
                optional={
                    "correlation": st.integers(0, 2**40),
                    "device": st.integers(0, 8),
                    "Collective name": st.sampled_from(["allreduce", "broadcast"]),
                    "In msg nelems": st.integers(0, 2**30),
                    "dtype": st.sampled_from(["Float", "BFloat16"]),
                    "Input Dims": st.lists(st.lists(st.integers(0, 9), max_size=2), max_size=2),
                },
            )
        },
    )
    return st.lists(event, max_size=8)


def _encode(value: Any) -> Any:
    if isinstance(value, Decimal):
        return float(value) if value != value.to_integral_value() else int(value)
    raise TypeError(value)


@SETTINGS
@given(events=_random_valid_events(), indent=st.sampled_from([None, 2, 4]))
def test_fast_reader_agrees_with_the_general_reader(
    events: list[dict[str, Any]], indent: int | None
) -> None:
    document = {
        "schemaVersion": 1,
        "baseTimeNanoseconds": 1_700_000_000_000_000_000,
        "traceEvents": events,
        "traceName": "x",
    }
    text = json.dumps(document, indent=indent, default=_encode, ensure_ascii=False).encode()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "t.json"
        path.write_bytes(text)
        raw = load_trace(path)
        general = load_trace(path, fast=False).events
    assert raw.events.equals(general), (raw.fast, raw.events.to_pylist(), general.to_pylist())
    assert raw.fast, "the fast reader refused a plain Kineto-shaped file"


@SETTINGS
@given(
    events=_random_valid_events(),
    indent=st.sampled_from([None, 2]),
    piece=st.integers(min_value=1, max_value=600),
    gzipped=st.booleans(),
)
def test_the_fast_reader_gives_the_same_table_in_any_piece_size(
    events: list[dict[str, Any]], indent: int | None, piece: int, gzipped: bool
) -> None:
    # Pieces of a few bytes put every boundary (inside strings, numbers, separators, the array's
    # brackets) at a piece boundary somewhere.
    document = {"schemaVersion": 1, "traceEvents": events, "traceName": "x"}
    text = json.dumps(document, indent=indent, default=_encode, ensure_ascii=False).encode()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / ("t.json.gz" if gzipped else "t.json")
        path.write_bytes(gzip.compress(text) if gzipped else text)
        whole = load_trace(path, piece=1 << 22)
        pieces = load_trace(path, piece=piece)
        general = load_trace(path, fast=False).events
    assert pieces.events.equals(general), (pieces.fast, piece)
    assert pieces.fast == whole.fast
    assert pieces.header == whole.header


# The fast reader's C scanner checks every field's JSON type as it reads it; a value of another
# type sends the file to the general reader, so the result is the general reader's.
_EVENT = '{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2, "ts": 10, "dur": 3'
TYPE_CASES = {
    "integer written as a float": (_EVENT.replace('"pid": 1', '"pid": 1.0') + "}", False),
    "boolean timestamp": (_EVENT.replace('"ts": 10', '"ts": true') + "}", False),
    "timestamp 0 (a relative clock)": (_EVENT.replace('"ts": 10', '"ts": 0') + "}", True),
    "string and float arguments": (_EVENT + ', "args": {"stream": "7", "device": 1.0}}', False),
    "integer arguments": (_EVENT + ', "args": {"stream": 7, "device": 0, "correlation": 5}}', True),
    "escapes in a name": (_EVENT.replace("aten::mm", 'a\\"b\\u00e9\\n') + "}", True),
    "label pid": (_EVENT.replace('"pid": 1', '"pid": "Spans"') + "}", True),
    # A prefix test cannot judge an escaped name: the event is decoded, and found a collective.
    "a collective's name written with an escape": (
        _EVENT.replace("aten::mm", "gloo\\u003aall_reduce")
        + ', "args": {"Collective name": "allreduce", "In msg nelems": 4, "dtype": "Float"}}',
        True,
    ),
    "boolean name": (_EVENT.replace('"aten::mm"', "true") + "}", False),
    "NaN duration": (_EVENT.replace('"dur": 3', '"dur": NaN') + "}", False),
    "number beyond the general reader's range": (
        _EVENT.replace('"tid": 2', '"tid": 9000000000000001') + "}",
        False,
    ),
}


@pytest.mark.parametrize("case", sorted(TYPE_CASES))
def test_a_value_of_another_json_type_gets_the_general_readers_answer(
    case: str, tmp_path: Path
) -> None:
    event, stays_fast = TYPE_CASES[case]
    path = tmp_path / "t.json"
    path.write_text('{"traceEvents": [' + event + ", " + _EVENT + "}]}")

    def outcome(fast: bool) -> Any:
        try:
            raw = load_trace(path, fast=fast)
        except TraceError as exc:
            return str(exc)
        return raw.events.to_pylist(), raw.fast

    fast, general = outcome(True), outcome(False)
    if isinstance(general, str):
        assert fast == general
        return
    assert fast[0] == general[0]
    assert fast[1] is stays_fast


def test_invalid_utf8_is_refused_by_both_readers(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_bytes(('{"traceEvents": [' + _EVENT + "}]}").encode().replace(b"mm", b"\xff\xfe"))
    with pytest.raises(TraceError, match="not UTF-8 text"):
        load_trace(path)


STRICT_CASES = {
    # (text after the traceEvents array's '[', what the general reader answers)
    "trailing comma in an event": (_EVENT + ', "dur": 4,}]}', "not valid JSON"),
    "trailing comma in the array": (_EVENT + "},]}", "not valid JSON"),
    "a repeated key (json keeps the last)": (_EVENT + ', "dur": 4}]}', None),
    "a repeated key in args": (_EVENT + ', "args": {"stream": 1, "stream": 2}}]}', None),
    "an escaped key": (_EVENT.replace('"dur"', '"d\\u0075r"') + "}]}", None),
    "NaN": (_EVENT.replace('"dur": 3', '"dur": NaN') + "}]}", "out of range"),
    "a leading zero": (_EVENT.replace('"dur": 3', '"dur": 03') + "}]}", "not valid JSON"),
    "a raw tab in a string": (_EVENT.replace("aten::mm", "aten\tmm") + "}]}", "not valid JSON"),
    "an escaped lone surrogate": (
        _EVENT.replace("aten::mm", "\\ud800") + "}]}",
        "surrogates not allowed",
    ),
    "a truncated event": (_EVENT, "ends early"),
    "an entry that is not an object": ("3]}", "expected an object"),
}


@pytest.mark.parametrize("case", sorted(STRICT_CASES))
def test_the_fast_reader_is_strict_json(case: str, tmp_path: Path) -> None:
    # The scanner reads only what json.loads reads the same way; anything else goes to the
    # general reader, so both give one answer: the same table, or the same error.
    tail, error = STRICT_CASES[case]
    path = tmp_path / "t.json"
    path.write_text('{"traceEvents": [' + tail)

    def outcome(fast: bool) -> Any:
        try:
            raw = load_trace(path, fast=fast)
        except (TraceError, UnicodeEncodeError) as exc:
            return str(exc)
        return raw.events.to_pylist(), raw.fast

    fast, general = outcome(True), outcome(False)
    if error is None:
        assert not isinstance(general, str), general
        assert fast == (general[0], False)
    else:
        assert isinstance(general, str) and error in general, general
        assert fast == general


# What a collective's argument may hold, in either reader's decoding (the general reader's
# numbers are Decimals).
ARG_VALUES = (
    st.none()
    | st.booleans()
    | st.integers(-(2**64), 2**64)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.decimals(allow_nan=False, allow_infinity=False, places=3)
    | st.text(max_size=6)
    | st.lists(st.integers(0, 9), max_size=3)
)


@SETTINGS
@given(raw=st.lists(ARG_VALUES, max_size=12), same=st.sampled_from([None, "int", "str"]))
def test_collective_arguments_are_converted_as_one_by_one(raw: list[Any], same: str | None) -> None:
    """The columns of collective arguments (one Arrow call for the common case) hold what
    integer_arg and text_arg give value by value, whatever the values."""
    import pyarrow as pa

    from perfdiag.engine.kineto.general_reader import integer_arg, text_arg
    from perfdiag.engine.kineto.parse import _arg_column

    if same == "int":  # the common case: whole numbers or absent
        raw = [v if v is None else i for i, v in enumerate(raw)]
    elif same == "str":
        raw = [v if v is None else f"group {i}" for i, v in enumerate(raw)]
    assert _arg_column(raw, pa.int64()).to_pylist() == [integer_arg(v) for v in raw]
    assert _arg_column(raw, pa.string()).to_pylist() == [text_arg(v) for v in raw]
