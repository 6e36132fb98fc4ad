"""The plan as the hook reads it (docs/design.md §3), with the standard library only (Python ≥ 3.9).

The plan file (`PERFDIAG_PLAN`) holds the plan in its one canonical form, the text of
`perfdiag.api.plan.Plan.to_json()`: a JSON object with the fields below (`start_step` only when
set), `deadline` in UTC to the second (`YYYY-MM-DDTHH:MM:SSZ`). `perfdiag run` writes that file
itself; on Kubernetes it is the pod's plan annotation projected alone by the downward API, which
the kubelet writes as the raw value, and as an empty file when the pod has no plan
(operator/injection.py). Anything else is rejected with the reason. In tests/collector_hook/,
test_plan_parity.py reads back every plan the writer can write, test_plan_file.py what is
rejected.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

ACTIONS = ("capture", "stacks", "watch")
ACTIVITIES = ("cpu", "cuda")
MAX_CAPTURE_STEPS = 1000  # perfdiag.api.plan.MAX_CAPTURE_STEPS
MAX_START_STEP = 10**12  # perfdiag.api.plan.MAX_START_STEP
MAX_ID_LENGTH = 128
REQUIRED = ("id", "action", "steps", "activities", "python_stacks", "deadline")
OPTIONAL = ("start_step",)  # absent when the plan has none (older hooks know no such field)
_DEADLINE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})Z")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


class PlanError(ValueError):
    """The plan file holds something that is not a plan in its canonical form."""


class HookPlan(NamedTuple):
    id: str
    action: str
    steps: int
    activities: Tuple[str, ...]
    python_stacks: bool
    deadline_unix: float
    start_step: Optional[int] = None


def plan_json(raw: bytes) -> Optional[str]:
    """The plan text of a plan file's bytes, or None when the file is empty (a pod without a
    plan annotation)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PlanError(f"the plan file is not UTF-8 ({exc.reason})") from None
    return text if text.strip() else None


def parse_plan(text: str) -> HookPlan:
    """Read a plan in its canonical form; raises PlanError saying what is wrong."""
    try:
        data = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_object)
    except ValueError as exc:
        raise PlanError(f"the plan is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise PlanError("the plan is not a JSON object")
    unknown = sorted(set(data) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        raise PlanError(f"unknown plan field(s): {', '.join(map(repr, unknown))}")
    missing = [name for name in REQUIRED if name not in data]
    if missing:
        raise PlanError(f"the plan has no {', '.join(map(repr, missing))}")
    start_step = None
    if "start_step" in data:
        start_step = _field(data, "start_step", _start_step, f"an integer in 0…{MAX_START_STEP}")
    return HookPlan(
        id=_field(data, "id", _plan_id, f"a string of 1 to {MAX_ID_LENGTH} characters"),
        action=_field(data, "action", ACTIONS.__contains__, f"one of {', '.join(ACTIONS)}"),
        steps=_field(data, "steps", _steps, f"an integer in 1…{MAX_CAPTURE_STEPS}"),
        activities=tuple(
            _field(data, "activities", _activities, f"a list of {' / '.join(ACTIVITIES)}")
        ),
        python_stacks=_field(data, "python_stacks", _boolean, "true or false"),
        deadline_unix=_deadline(data["deadline"]),
        start_step=start_step,
    )


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _object(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        raise ValueError("a field appears twice")
    return found


def _field(data: Dict[str, Any], name: str, valid: Callable[[Any], bool], wanted: str) -> Any:
    value = data[name]
    if not valid(value):
        raise PlanError(f"{name!r} must be {wanted}, not {value!r}")
    return value


def _integer(value: Any, low: int, high: int) -> bool:
    return type(value) is int and low <= value <= high


def _plan_id(value: Any) -> bool:
    return type(value) is str and 1 <= len(value) <= MAX_ID_LENGTH


def _steps(value: Any) -> bool:
    return _integer(value, 1, MAX_CAPTURE_STEPS)


def _start_step(value: Any) -> bool:
    return _integer(value, 0, MAX_START_STEP)


def _boolean(value: Any) -> bool:
    return type(value) is bool


def _activities(value: Any) -> bool:
    return type(value) is list and all(type(item) is str and item in ACTIVITIES for item in value)


def _deadline(value: Any) -> float:
    """Unix seconds of a YYYY-MM-DDTHH:MM:SSZ date-time."""
    match = _DEADLINE.fullmatch(value) if type(value) is str else None
    try:
        if match is None:
            raise ValueError
        year, month, day, hour, minute, second = map(int, match.groups())
        moment = datetime(year, month, day, hour, minute, second, tzinfo=timezone.utc)
    except ValueError:
        wanted = "a UTC date-time YYYY-MM-DDTHH:MM:SSZ"
        raise PlanError(f"'deadline' must be {wanted}, not {value!r}") from None
    return (moment - _EPOCH) / timedelta(seconds=1)
