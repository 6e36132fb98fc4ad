"""The plan file holds the plan's canonical form and nothing else: the hook's reader rejects,
with the reason, whatever the writer does not write (the lenient forms the model would accept
included), and an empty file (a pod without a plan annotation) holds no plan."""

from __future__ import annotations

import json
from typing import Any

import pytest

from perfdiag.api.plan import Plan
from perfdiag.collector.hook.plan import REQUIRED, PlanError, parse_plan, plan_json

VALID: dict[str, Any] = json.loads(Plan.new(plan_id="p-1", steps=3, start_step=7).to_json())


def with_field(name: str, value: Any) -> str:
    return json.dumps({**VALID, name: value})


def without(name: str) -> str:
    return json.dumps({key: value for key, value in VALID.items() if key != name})


def test_a_canonical_plan_is_read() -> None:
    plan = parse_plan(json.dumps(VALID))
    assert (plan.id, plan.steps, plan.start_step) == ("p-1", 3, 7)
    assert parse_plan(without("start_step")).start_step is None  # left out when absent


def test_files_without_a_plan() -> None:
    assert plan_json(b"") is None  # what the kubelet projects for an absent annotation
    assert plan_json(b"\n \n") is None
    text = json.dumps(VALID)
    assert plan_json(text.encode()) == text


def test_a_file_that_is_not_utf8() -> None:
    with pytest.raises(PlanError, match="not UTF-8"):
        plan_json(b"\xff\xfe{}")


BROKEN = [
    # Not a JSON object.
    ("{not json", "not valid JSON"),
    ('{"id": "a", "steps": NaN}', "not valid JSON (NaN is not JSON)"),
    ('{"id": "a", "id": "b"}', "not valid JSON (a field appears twice)"),
    ('["not", "an", "object"]', "not a JSON object"),
    # What the whole-annotations projection used to be: key="value" lines, Go %q quoting.
    ('perfdiag.io/plan="{\\"id\\": \\"a\\"}"\n', "not valid JSON"),
    # Fields.
    (with_field("extra", 1), "unknown plan field(s): 'extra'"),
    (with_field("Steps", 1), "unknown plan field(s): 'Steps'"),
    *[(without(name), f"the plan has no '{name}'") for name in REQUIRED],
    (with_field("id", ""), "'id' must be a string of 1 to 128 characters, not ''"),
    (with_field("id", "x" * 129), "'id' must be a string of 1 to 128 characters"),
    (with_field("id", 42), "'id' must be a string of 1 to 128 characters, not 42"),
    (with_field("action", "Capture"), "'action' must be one of capture, stacks, watch"),
    (with_field("action", None), "'action' must be one of capture, stacks, watch, not None"),
    (with_field("action", ["capture"]), "'action' must be one of capture, stacks, watch"),
    (with_field("steps", "3"), "'steps' must be an integer in 1…1000, not '3'"),
    (with_field("steps", 3.0), "'steps' must be an integer in 1…1000, not 3.0"),
    (with_field("steps", True), "'steps' must be an integer in 1…1000, not True"),
    (with_field("steps", 0), "'steps' must be an integer in 1…1000, not 0"),
    (with_field("steps", 1001), "'steps' must be an integer in 1…1000, not 1001"),
    (with_field("activities", "cpu"), "'activities' must be a list of cpu / cuda"),
    (with_field("activities", ["gpu"]), "'activities' must be a list of cpu / cuda"),
    (with_field("activities", [1]), "'activities' must be a list of cpu / cuda"),
    (with_field("python_stacks", "yes"), "'python_stacks' must be true or false, not 'yes'"),
    (with_field("python_stacks", 1), "'python_stacks' must be true or false, not 1"),
    (with_field("start_step", None), "'start_step' must be an integer in 0…1000000000000"),
    (with_field("start_step", -1), "'start_step' must be an integer in 0…1000000000000"),
    (with_field("start_step", 10**12 + 1), "'start_step' must be an integer in 0…"),
    (with_field("start_step", "5"), "'start_step' must be an integer in 0…"),
    *[
        (with_field("deadline", value), "'deadline' must be a UTC date-time YYYY-MM-DDTHH:MM:SSZ")
        for value in [
            "2030-01-01",
            "2030-01-01T00:00:00",
            "2030-01-01T00:00:00+00:00",
            "2030-01-01T00:00:00.5Z",
            "2030-01-01 00:00:00Z",
            "2030-01-01T00:00:00z",
            "2030-02-30T00:00:00Z",
            "2030-01-01T24:00:00Z",
            "0000-01-01T00:00:00Z",
            "２０３０-01-01T00:00:00Z",  # digits, but not ASCII ones
            1900000000,
            None,
        ]
    ],
]


@pytest.mark.parametrize(("text", "reason"), BROKEN)
def test_anything_but_the_canonical_form_is_rejected_with_the_reason(
    text: str, reason: str
) -> None:
    with pytest.raises(PlanError) as caught:
        parse_plan(text)
    assert reason in str(caught.value)
