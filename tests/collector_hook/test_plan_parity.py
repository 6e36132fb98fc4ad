"""The hook's standard-library plan parser accepts exactly what the pydantic `Plan` accepts
(`Plan.model_validate_json`, lax mode), and reads the same values."""

from __future__ import annotations

import json
from datetime import timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from perfdiag.api.plan import Plan
from perfdiag.collector.hook.plan import HookPlan, PlanError, parse_plan

WHITESPACE = ["", " ", "\t", "\n", "\xa0", "  ", "\r\n"]

int_strings = st.builds(
    lambda lead, sign, digits, groups, fraction, trail: (
        f"{lead}{sign}{digits}{''.join('_' + g for g in groups)}{fraction}{trail}"
    ),
    st.sampled_from(WHITESPACE),
    st.sampled_from(["", "+", "-", "--", "+ "]),
    st.text("0123456789", min_size=1, max_size=5),
    st.lists(st.text("0123456789", min_size=0, max_size=2), max_size=2),
    st.sampled_from(["", ".0", ".00", ".", ".5", "e0", ".0_0"]),
    st.sampled_from(WHITESPACE),
)
steps_values = st.one_of(
    st.integers(-5, 1100),
    st.integers(-(10**20), 10**20),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([5.0, 1000.0, 1000.5, -0.0, 1e3, 999.9999]),
    int_strings,
    st.text(max_size=4),
    st.none(),
    st.lists(st.integers(1, 3), max_size=2),
)
bool_words = ["0", "off", "f", "false", "n", "no", "1", "on", "t", "true", "y", "yes"]
python_stacks_values = st.one_of(
    st.booleans(),
    st.integers(-2, 3),
    st.sampled_from([0.0, 1.0, 0.5, -1.0]),
    st.sampled_from(bool_words).flatmap(
        lambda word: st.sampled_from([word, word.upper(), word.title(), f" {word}", f"{word} "])
    ),
    st.sampled_from(["", "2", "1.0", "tru", "none"]),
    st.none(),
)
id_values = st.one_of(
    st.text(max_size=8),
    st.text("ab", min_size=126, max_size=130),
    st.text(min_size=126, max_size=130),
    st.integers(),
    st.none(),
    st.booleans(),
)
action_values = st.one_of(
    st.sampled_from(["capture", "stacks", "Capture", "", "explode", " stacks"]),
    st.none(),
    st.integers(0, 2),
)
activities_values = st.one_of(
    st.lists(st.sampled_from(["cpu", "cuda", "gpu", "CPU", "", 1, None]), max_size=3),
    st.sampled_from(["cpu", None, 1, {"cpu": True}]),
)


def two_digits(low: int, high: int) -> st.SearchStrategy[str]:
    return st.one_of(st.integers(low, high).map(lambda n: f"{n:02d}"), st.just("1"))


date_times = st.builds(
    lambda year, month, day, time, zone: f"{year}-{month}-{day}{time}{zone}",
    st.one_of(st.integers(1, 9999).map(lambda n: f"{n:04d}"), st.just("0000"), st.just("99")),
    two_digits(0, 13),
    two_digits(0, 32),
    st.one_of(
        st.just(""),
        st.builds(
            lambda sep, hour, minute, second: f"{sep}{hour}:{minute}{second}",
            st.sampled_from(["T", "t", " ", "_", "x", ""]),
            two_digits(0, 24),
            two_digits(0, 60),
            st.one_of(
                st.just(""),
                st.builds(
                    lambda sec, frac: f":{sec}{frac}",
                    two_digits(0, 61),
                    st.one_of(
                        st.just(""),
                        st.just("."),
                        st.builds(
                            lambda mark, digits: f"{mark}{digits}",
                            st.sampled_from([".", ","]),
                            st.text("0123456789", min_size=1, max_size=12),
                        ),
                    ),
                ),
            ),
        ),
    ),
    st.one_of(
        st.sampled_from(["", "Z", "z", "ZZ", " Z"]),
        st.builds(
            lambda sign, hours, colon, minutes: f"{sign}{hours}{colon}{minutes}",
            st.sampled_from(["+", "-"]),
            two_digits(0, 24),
            st.sampled_from([":", ""]),
            st.one_of(two_digits(0, 60), st.just("")),
        ),
    ),
)
unix_strings = st.builds(
    lambda sign, whole, fraction: f"{sign}{whole}{fraction}",
    st.sampled_from(["", "+", "-"]),
    st.text("0123456789", min_size=0, max_size=16),
    st.one_of(st.just(""), st.text("0123456789", max_size=4).map(lambda d: "." + d)),
)
deadline_values = st.one_of(
    date_times,
    st.integers(-(10**14), 10**16),
    st.floats(min_value=-1e14, max_value=1e16),
    unix_strings,
    st.text(max_size=12),
    st.none(),
    st.booleans(),
)


VALID = {
    "id": "p-1",
    "action": "capture",
    "steps": 3,
    "activities": ["cpu", "cuda"],
    "python_stacks": False,
    "deadline": "2030-01-01T00:00:00Z",
}
WILD = {
    "id": id_values,
    "action": action_values,
    "steps": steps_values,
    "activities": activities_values,
    "python_stacks": python_stacks_values,
    "deadline": deadline_values,
    "start_step": st.one_of(st.none(), steps_values),
}


@st.composite
def plan_documents(draw: st.DrawFn) -> dict[str, Any]:
    """A valid plan with one or two fields drawn wild (so that each field's own validation
    decides), sometimes a field left out or an unknown one added."""
    document = dict(VALID)
    for name in draw(st.lists(st.sampled_from(sorted(WILD)), min_size=1, max_size=2)):
        document[name] = draw(WILD[name])
    if draw(st.integers(0, 9)) == 0:
        del document[draw(st.sampled_from(sorted(document)))]
    if draw(st.integers(0, 19)) == 0:
        document[draw(st.sampled_from(["extra", "Steps", "deadline_s"]))] = 1
    return document


def pydantic_reading(text: str) -> Plan | None:
    try:
        return Plan.model_validate_json(text)
    except ValidationError:
        return None


def hook_reading(text: str) -> HookPlan | None:
    try:
        return parse_plan(text)
    except PlanError:
        return None


def assert_same_reading(text: str) -> None:
    expected, got = pydantic_reading(text), hook_reading(text)
    assert (expected is None) == (got is None), (text, expected, got)
    if expected is None or got is None:
        return
    deadline = expected.deadline
    if deadline.tzinfo is None:
        deadline = deadline.replace(tzinfo=timezone.utc)
    assert got.id == expected.id
    assert got.action == expected.action
    assert got.steps == expected.steps
    assert list(got.activities) == list(expected.activities)
    assert got.python_stacks == expected.python_stacks
    assert got.start_step == expected.start_step
    assert got.deadline_unix == pytest.approx(deadline.timestamp(), abs=1e-3), text


@settings(max_examples=1500, deadline=None)
@given(plan_documents())
def test_hook_parser_agrees_with_the_pydantic_plan(document: dict[str, Any]) -> None:
    assert_same_reading(json.dumps(document))


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
def test_hook_parser_agrees_on_arbitrary_text(text: str) -> None:
    assert_same_reading(text)


@pytest.mark.parametrize(
    "text",
    [
        Plan.new(plan_id="abc", steps=7, python_stacks=True).to_json(),
        '{"id": "a", "deadline": "2030-01-01"}',
        '{"id": "a", "deadline": 1900000000000}',
        '{"id": "a", "deadline": "2030-01-01T00:00:00.9999999+02:30", "steps": " 5.0 "}',
        '{"id": "a", "deadline": "2030-01-01T00:00:00Z", "steps": NaN}',
        '{"id": "a", "deadline": "2030-01-01T00:00:00Z", "steps": Infinity}',
        '{"id": "a", "deadline": "2030-02-29T00:00:00Z"}',
        '{"id": "a", "deadline": "2032-02-29T00:00:00Z", "python_stacks": "YES"}',
        '["not", "an", "object"]',
        "",
        "{",
    ],
)
def test_known_cases(text: str) -> None:
    assert_same_reading(text)
