"""The plan's writer and the hook's reader agree: every plan `Plan.to_json()` can write (the one
canonical form the operator and `perfdiag run` write) is read back by the hook's standard-library
reader with exactly the plan's values, and by the model itself (the analyzer reads plan.json)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import get_args

from hypothesis import given, settings
from hypothesis import strategies as st

from perfdiag.api.plan import MAX_CAPTURE_STEPS, MAX_START_STEP, Activity, Plan, PlanAction
from perfdiag.collector.hook.plan import HookPlan, parse_plan, plan_json

offsets = st.integers(-(24 * 60 - 1), 24 * 60 - 1).map(lambda m: timezone(timedelta(minutes=m)))
deadlines = st.datetimes(
    # A day inside years 1…9999 either way, so that the deadline has a UTC time in that range.
    min_value=datetime(1, 1, 2),
    max_value=datetime(9999, 12, 30),
    timezones=st.one_of(st.none(), st.just(timezone.utc), offsets),
)
plans = st.builds(
    Plan,
    id=st.text(min_size=1, max_size=128),
    action=st.sampled_from(get_args(PlanAction)),
    steps=st.integers(1, MAX_CAPTURE_STEPS),
    activities=st.lists(st.sampled_from(get_args(Activity)), max_size=3),
    python_stacks=st.booleans(),
    deadline=deadlines,
    start_step=st.one_of(st.none(), st.integers(0, MAX_START_STEP)),
)


def utc_to_the_second(moment: datetime) -> datetime:
    """The deadline the canonical form carries: UTC (a naive one taken as UTC), whole seconds."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc).replace(microsecond=0)


@settings(max_examples=600, deadline=None)
@given(plans)
def test_the_hook_reads_back_every_plan_as_written(plan: Plan) -> None:
    text = plan.to_json()
    # One line of ASCII: nothing a downward-API projection or a file system could alter.
    assert text.isascii() and "\n" not in text
    assert plan_json(text.encode()) == text
    deadline = utc_to_the_second(plan.deadline)
    assert parse_plan(text) == HookPlan(
        id=plan.id,
        action=plan.action,
        steps=plan.steps,
        activities=tuple(plan.activities),
        python_stacks=plan.python_stacks,
        deadline_unix=deadline.timestamp(),
        start_step=plan.start_step,
    )
    again = Plan.model_validate_json(text)
    assert again == plan.model_copy(update={"deadline": deadline})
    assert again.to_json() == text  # the canonical form is a fixed point


def test_the_canonical_form() -> None:
    plan = Plan(
        id="p-1",
        steps=3,
        deadline=datetime(2030, 1, 1, 2, 30, 0, 999999, tzinfo=timezone(timedelta(hours=2))),
    )
    assert plan.to_json() == (
        '{"action": "capture", "activities": ["cpu", "cuda"], "deadline": "2030-01-01T00:30:00Z", '
        '"id": "p-1", "python_stacks": false, "steps": 3}'
    )
    early = plan.model_copy(update={"deadline": datetime(5, 6, 7, 8, 9, 10), "start_step": 0})
    assert '"deadline": "0005-06-07T08:09:10Z"' in early.to_json()
    assert '"start_step": 0' in early.to_json()
