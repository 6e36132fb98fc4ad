"""The plan as the hook reads it (docs/design.md §3), with the standard library only (Python ≥ 3.9).

The plan file (`PERFDIAG_PLAN`) holds either the plan JSON itself (local mode) or a Kubernetes
downward-API annotations file (lines `key="value"`, the value quoted like Go's %q) in which the
plan is the annotation `perfdiag.io/plan`.

Validation matches `perfdiag.api.plan.Plan.model_validate_json`, pydantic's lax JSON mode
included (numeric strings for `steps`, "yes"/"off"… for `python_stacks`, unix timestamps for
`deadline`); tests/collector_hook/test_plan_parity.py keeps the two in agreement. A deadline
without a UTC offset is read as UTC.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone
from typing import Any, Dict, NamedTuple, Optional, Tuple

PLAN_ANNOTATION = "perfdiag.io/plan"
ACTIONS = ("capture", "stacks", "watch")
ACTIVITIES = ("cpu", "cuda")
MAX_CAPTURE_STEPS = 1000  # perfdiag.api.plan.MAX_CAPTURE_STEPS
MAX_START_STEP = 10**12  # perfdiag.api.plan.MAX_START_STEP
MAX_ID_LENGTH = 128
FIELDS = ("id", "action", "steps", "activities", "python_stacks", "deadline", "start_step")

# Unix timestamps: larger magnitudes are milliseconds; the result must lie in years 1 … 9999.
_MS_THRESHOLD = 2e10
_MIN_UNIX = -62135596800.0  # 0001-01-01T00:00:00Z
_MAX_UNIX = 253402300800.0  # 10000-01-01T00:00:00Z (exclusive)

# Unicode White_Space, what pydantic strips around numeric strings.
_WHITESPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
# pydantic also skips a leading run of zeros and underscores ("0__1" is 1).
_INT_TEXT = re.compile(r"[+-]?(?:0[0_]*)?([0-9]+(?:_[0-9]+)*)(?:\.0+)?")
_BOOL_TEXT = {
    "0": False, "off": False, "f": False, "false": False, "n": False, "no": False,
    "1": True, "on": True, "t": True, "true": True, "y": True, "yes": True,
}  # fmt: skip
_UNIX_INT_TEXT = re.compile(r"[+-]?[0-9]+")
_UNIX_FLOAT_TEXT = re.compile(r"[+-]?(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_DATETIME_TEXT = re.compile(
    r"(?P<y>[0-9]{4})-(?P<mo>[0-9]{2})-(?P<d>[0-9]{2})"
    r"(?:[Tt _](?P<h>[0-9]{2}):(?P<mi>[0-9]{2})"
    r"(?::(?P<s>[0-9]{2})(?:[.,](?P<frac>[0-9]+))?)?"
    r"(?:(?P<z>[Zz])|(?P<sign>[+-])(?P<oh>[0-9]{2}):?(?P<om>[0-9]{2}))?)?"
)


class PlanError(ValueError):
    """The plan file holds something that is not a valid plan."""


class HookPlan(NamedTuple):
    id: str
    action: str
    steps: int
    activities: Tuple[str, ...]
    python_stacks: bool
    deadline_unix: float
    start_step: Optional[int] = None


def plan_json(raw: bytes) -> Optional[str]:
    """The plan JSON held by a plan file's bytes, or None when it holds no plan."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PlanError(f"the plan file is not UTF-8 ({exc.reason})") from None
    stripped = text.strip()
    if not stripped:
        return None
    if stripped.startswith("{"):
        return stripped
    return parse_annotations(text).get(PLAN_ANNOTATION)


def parse_annotations(text: str) -> Dict[str, str]:
    """A downward-API annotations file → {key: value}. Lines that do not parse are skipped,
    except the plan's own (a plan that cannot be read must be reported, not ignored)."""
    found: Dict[str, str] = {}
    for line in text.splitlines():
        key, sep, quoted = line.partition("=")
        if not sep:
            continue
        try:
            found[key.strip()] = unquote_go(quoted.strip())
        except ValueError as exc:
            if key.strip() == PLAN_ANNOTATION:
                raise PlanError(
                    f"annotation {PLAN_ANNOTATION} is not a quoted string: {exc}"
                ) from None
    return found


_SIMPLE_ESCAPES = {
    "a": b"\a", "b": b"\b", "f": b"\f", "n": b"\n", "r": b"\r", "t": b"\t", "v": b"\v",
    "\\": b"\\", '"': b'"', "'": b"'",
}  # fmt: skip


def unquote_go(quoted: str) -> str:
    """The value of a Go double-quoted string literal (what strconv.Quote / %q write)."""
    if len(quoted) < 2 or quoted[0] != '"' or quoted[-1] != '"':
        raise ValueError("missing double quotes")
    body = quoted[1:-1]
    out = bytearray()
    i = 0
    while i < len(body):
        char = body[i]
        if char == '"':
            raise ValueError("unescaped double quote")
        if char != "\\":
            out += char.encode("utf-8", "surrogatepass")
            i += 1
            continue
        if i + 1 >= len(body):
            raise ValueError("dangling backslash")
        code = body[i + 1]
        if code in _SIMPLE_ESCAPES:
            out += _SIMPLE_ESCAPES[code]
            i += 2
        elif code in "xuU":
            width = {"x": 2, "u": 4, "U": 8}[code]
            digits = body[i + 2 : i + 2 + width]
            if len(digits) != width or not all(c in "0123456789abcdefABCDEF" for c in digits):
                raise ValueError(f"bad \\{code} escape")
            value = int(digits, 16)
            if code == "x":
                out.append(value)
            else:
                if value > 0x10FFFF or 0xD800 <= value <= 0xDFFF:
                    raise ValueError(f"bad \\{code} escape")
                out += chr(value).encode("utf-8")
            i += 2 + width
        elif code in "01234567":
            digits = body[i + 1 : i + 4]
            if len(digits) != 3 or not all(c in "01234567" for c in digits) or int(digits, 8) > 255:
                raise ValueError("bad octal escape")
            out.append(int(digits, 8))
            i += 4
        else:
            raise ValueError(f"unknown escape \\{code}")
    return out.decode("utf-8", "replace")


def parse_plan(text: str) -> HookPlan:
    """Validate plan JSON; raises PlanError saying what is wrong."""
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except ValueError as exc:
        raise PlanError(f"the plan is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise PlanError("the plan is not a JSON object")
    extra = sorted(set(data) - set(FIELDS))
    if extra:
        raise PlanError(f"unknown plan field(s): {', '.join(map(repr, extra))}")
    for required in ("id", "deadline"):
        if required not in data:
            raise PlanError(f"the plan has no {required!r}")
    return HookPlan(
        id=_plan_id(data["id"]),
        action=_action(data.get("action", "capture")),
        steps=_steps(data.get("steps", 10)),
        activities=_activities(data.get("activities", ["cpu", "cuda"])),
        python_stacks=_python_stacks(data.get("python_stacks", False)),
        deadline_unix=_deadline(data["deadline"]),
        start_step=_start_step(data.get("start_step")),
    )


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _plan_id(value: Any) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_ID_LENGTH:
        raise PlanError(f"'id' must be a string of 1 to {MAX_ID_LENGTH} characters")
    return value


def _action(value: Any) -> str:
    if not isinstance(value, str) or value not in ACTIONS:
        raise PlanError(f"unknown action {value!r} (known: {', '.join(ACTIONS)})")
    return value


def _steps(value: Any) -> int:
    number = _lax_int(value)
    if number is None or not 1 <= number <= MAX_CAPTURE_STEPS:
        raise PlanError(f"'steps' must be an integer in 1…{MAX_CAPTURE_STEPS}, not {value!r}")
    return number


def _start_step(value: Any) -> Optional[int]:
    if value is None:
        return None
    number = _lax_int(value)
    if number is None or not 0 <= number <= MAX_START_STEP:
        raise PlanError(f"'start_step' must be an integer in 0…{MAX_START_STEP} or null")
    return number


def _lax_int(value: Any) -> Optional[int]:
    if isinstance(value, int):  # bool included, as pydantic's lax mode does
        return int(value)
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if isinstance(value, str):
        match = _INT_TEXT.fullmatch(value.strip(_WHITESPACE))
        if match is None:
            return None
        magnitude = int(match.group(1).replace("_", ""))
        return -magnitude if value.strip(_WHITESPACE).startswith("-") else magnitude
    return None


def _activities(value: Any) -> Tuple[str, ...]:
    if not isinstance(value, list) or not all(
        isinstance(item, str) and item in ACTIVITIES for item in value
    ):
        raise PlanError(f"'activities' must be a list of {' / '.join(ACTIVITIES)}")
    return tuple(value)


def _python_stacks(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in _BOOL_TEXT:
        return _BOOL_TEXT[value.lower()]
    raise PlanError(f"'python_stacks' must be a boolean, not {value!r}")


def _deadline(value: Any) -> float:
    """Unix seconds of an RFC 3339 date-time (or date, or unix timestamp)."""
    if isinstance(value, bool):
        raise PlanError("'deadline' must be an RFC 3339 date-time")
    if isinstance(value, (int, float)):
        return _unix(float(value), value)
    if not isinstance(value, str):
        raise PlanError("'deadline' must be an RFC 3339 date-time")
    if _UNIX_INT_TEXT.fullmatch(value):
        return _unix(float(int(value)), value)
    if _UNIX_FLOAT_TEXT.fullmatch(value):
        return _unix(float(value), value)
    match = _DATETIME_TEXT.fullmatch(value)
    if match is None:
        raise PlanError(f"'deadline' is not an RFC 3339 date-time: {value!r}")
    parts = match.groupdict()
    offset = timedelta(0)
    if parts["sign"]:
        hours, minutes = int(parts["oh"]), int(parts["om"])
        if hours > 23 or minutes > 59:
            raise PlanError(f"'deadline' has a bad UTC offset: {value!r}")
        offset = timedelta(hours=hours, minutes=minutes)
        if parts["sign"] == "-":
            offset = -offset
    try:
        moment = datetime(
            int(parts["y"]),
            int(parts["mo"]),
            int(parts["d"]),
            int(parts["h"] or 0),
            int(parts["mi"] or 0),
            int(parts["s"] or 0),
            int((parts["frac"] or "0")[:6].ljust(6, "0")),
            tzinfo=timezone(offset),
        )
    except ValueError:
        raise PlanError(f"'deadline' is not a valid date-time: {value!r}") from None
    epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
    return (moment - epoch) / timedelta(seconds=1)


def _unix(number: float, original: Any) -> float:
    seconds = number / 1000.0 if abs(number) > _MS_THRESHOLD else number
    if not _MIN_UNIX <= seconds < _MAX_UNIX:
        raise PlanError(f"'deadline' is out of range: {original!r}")
    return seconds
