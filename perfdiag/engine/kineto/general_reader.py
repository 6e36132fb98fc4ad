"""The general JSON reader: `json.loads` (exact decimals) and a loop. Reads any valid JSON into
the same table as the fast reader, and words the error for malformed input. It reads the text
as perfdiag.engine.kineto.text hands it over: within the limits, squeezed, UTF-8."""

from __future__ import annotations

import contextlib
import json
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa

from perfdiag.engine.kineto.json_shape import ARGS, JSON_SCHEMA, MAX_NUMBER, TraceError
from perfdiag.engine.kineto.text import Text

_LABEL = {"pid": "pis", "tid": "tis"}
_MAX_NUMBER = Decimal(MAX_NUMBER)


def read_general(path: Path, text: Text) -> tuple[dict[str, Any], pa.Table, list[Any]]:
    """(top-level fields, JSON_SCHEMA table, the decoded traceEvents)."""
    try:
        doc = json.loads(text.text, parse_float=Decimal)
    except json.JSONDecodeError as exc:
        where = text.where(exc.pos)
        if text.ends_early(exc.pos):
            raise TraceError(f"{path}: not valid JSON: the file ends early ({where})") from exc
        raise TraceError(f"{path}: not valid JSON: {exc.msg} ({where})") from exc
    except RecursionError as exc:
        raise TraceError(f"{path}: not valid JSON: nested too deeply") from exc
    if not isinstance(doc, dict):
        raise TraceError(
            f"{path}: not a Kineto trace: the top level is a JSON {json_type(doc)}, "
            "expected an object with 'traceEvents'"
        )
    events = doc.pop("traceEvents", None)
    if events is None:
        raise TraceError(f"{path}: not a Kineto trace: no 'traceEvents' field")
    if not isinstance(events, list):
        raise TraceError(
            f"{path}: not a Kineto trace: 'traceEvents' is a JSON {json_type(events)}, "
            "expected an array"
        )
    return doc, _table(path, events), events


def json_type(value: Any) -> str:
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


def _table(path: Path, events: list[Any]) -> pa.Table:
    columns: dict[str, list[Any]] = {name: [] for name in JSON_SCHEMA.names}
    arg_names = [field.name for field in ARGS]
    args_columns: dict[str, list[Any]] = {key: [] for key in arg_names}
    for index, event in enumerate(events):
        if not isinstance(event, dict):
            raise TraceError(
                f"{path}: traceEvents[{index}] is a JSON {json_type(event)}, expected an object"
            )
        ph = event.get("ph")
        columns["ph"].append(ph if isinstance(ph, str) else None)
        columns["args"].append(None)
        if ph != "X":
            for name in ("cat", "name", "pid", "pis", "tid", "tis", "ts", "dur"):
                columns[name].append(None)
            for key in args_columns:
                args_columns[key].append(None)
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
        args = event.get("args")
        args = args if isinstance(args, dict) else {}
        for key in args_columns:
            args_columns[key].append(integer_arg(args.get(key)))
    arrays: dict[str, pa.Array] = {}
    for field in JSON_SCHEMA:
        if field.name != "args":
            arrays[field.name] = pa.array(columns[field.name], field.type)
    arrays["args"] = pa.StructArray.from_arrays(
        [pa.array(args_columns[key], pa.int64()) for key in arg_names], names=arg_names
    )
    return pa.table(arrays, schema=JSON_SCHEMA)


def _text(path: Path, index: int, event: dict[str, Any], field: str) -> str | None:
    value = event.get(field)
    if value is None or isinstance(value, str):
        return value
    raise TraceError(
        f"{path}: traceEvents[{index}] field {field!r} is a JSON {json_type(value)}, "
        "expected a string"
    )


def _number(path: Path, index: int, event: dict[str, Any], field: str) -> Decimal | None:
    value = event.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
        raise TraceError(
            f"{path}: traceEvents[{index}] field {field!r} is a JSON {json_type(value)}, "
            "expected a number"
        )
    number = Decimal(value)
    if not number.is_finite() or abs(number) >= _MAX_NUMBER:
        raise TraceError(f"{path}: traceEvents[{index}] field {field!r} is out of range ({value})")
    return number


def _integer(path: Path, index: int, event: dict[str, Any], field: str) -> int | None:
    value = _number(path, index, event, field)
    if value is None:
        return None
    if value != value.to_integral_value():
        raise TraceError(f"{path}: traceEvents[{index}] field {field!r} is not an integer")
    return int(value)


def _decimal_ts(path: Path, index: int, event: dict[str, Any]) -> Decimal | None:
    text = event.get("ts")
    if isinstance(text, str):  # a number written as a string: read as pyarrow does
        with contextlib.suppress(ArithmeticError):
            event = {**event, "ts": Decimal(text.strip())}
    value = _number(path, index, event, "ts")
    if value is None:
        return None
    return value.quantize(Decimal("0.001"), rounding=ROUND_HALF_EVEN)


def _float(path: Path, index: int, event: dict[str, Any], field: str) -> float | None:
    value = _number(path, index, event, field)
    return None if value is None else float(value)


def integer_arg(value: Any) -> int | None:
    """An integer argument, or None when it is absent or not an integer (as both readers do)."""
    if isinstance(value, bool) or not isinstance(value, int | Decimal | float):
        return None
    number = Decimal(value)
    if not number.is_finite() or number != number.to_integral_value():
        return None
    integer = int(number)
    return integer if -(2**63) <= integer < 2**63 else None


def text_arg(value: Any) -> str | None:
    """A string argument; other JSON values as their JSON text (numbers as floats print, so
    that both readers give the same text)."""
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(_plain(value))


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value
