"""The plan file: plan JSON itself, or a downward-API annotations file (Go %q quoting)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perfdiag.api.plan import Plan
from perfdiag.collector.hook.plan import PlanError, parse_annotations, plan_json, unquote_go

# Written by Go 1.26 with fmt.Sprintf("%v=%q\n", key, value), as the kubelet formats the
# downward-API annotations file (k8s.io/kubernetes/pkg/fieldpath.FormatMap).
GO_ANNOTATIONS = (
    'kubernetes.io/config.seen="2026-11-21T23:00:00.000000000Z"\n'
    'perfdiag.io/plan="{\\"action\\": \\"capture\\", \\"activities\\": [\\"cpu\\", \\"cuda\\"], '
    '\\"deadline\\": \\"2030-01-01T00:00:00Z\\", \\"id\\": \\"p-1\\", \\"python_stacks\\": true, '
    '\\"steps\\": 3}"\n'
    'weird="tab\\there\\nnewline \\\\ back \\"q\\" bell\\a nul\\x00 del\\x7f é 😀 \\u200b 😀 bad\\xff"'
)


def go_quote(value: str) -> str:
    """strconv.Quote for valid UTF-8 text (the reference for the round trip below)."""
    escapes = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t",
               "\v": "\\v", "\\": "\\\\", '"': '\\"'}  # fmt: skip
    out = []
    for char in value:
        code = ord(char)
        if char in escapes:
            out.append(escapes[char])
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif not char.isprintable():
            out.append(f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def test_annotations_written_by_go_are_read() -> None:
    annotations = parse_annotations(GO_ANNOTATIONS)
    assert annotations["kubernetes.io/config.seen"] == "2026-11-21T23:00:00.000000000Z"
    assert annotations["weird"] == (
        'tab\there\nnewline \\ back "q" bell\a nul\x00 del\x7f é 😀 \u200b 😀 bad\ufffd'
    )
    text = plan_json(GO_ANNOTATIONS.encode())
    assert text is not None
    plan = Plan.model_validate_json(text)
    assert (plan.id, plan.steps, plan.python_stacks) == ("p-1", 3, True)


@given(st.text())
def test_go_quoting_round_trips(value: str) -> None:
    assert unquote_go(go_quote(value)) == value


def test_plan_json_in_either_form() -> None:
    plan = Plan.new(plan_id="x1", steps=4)
    assert plan_json(plan.to_json().encode()) == plan.to_json()
    assert plan_json(b"  \n" + plan.to_json().encode() + b"\n") == plan.to_json()
    annotations = f'a="b"\nperfdiag.io/plan={go_quote(plan.to_json())}\nz=""\n'
    assert plan_json(annotations.encode()) == plan.to_json()


def test_files_without_a_plan() -> None:
    assert plan_json(b"") is None
    assert plan_json(b"\n \n") is None
    assert plan_json(b'other="x"\nbroken=unquoted\n') is None  # others' lines do not matter


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"perfdiag.io/plan=unquoted", "not a quoted string"),
        (b'perfdiag.io/plan="bad \\q escape"', "not a quoted string"),
        (b'perfdiag.io/plan="dangling\\"', "not a quoted string"),
        (b"\xff\xfe{}", "not UTF-8"),
    ],
)
def test_unreadable_plan_annotation_is_an_error(raw: bytes, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        plan_json(raw)


def test_octal_and_escape_forms() -> None:
    assert unquote_go('"\\101\\x42\\u0043\\U00000044"') == "ABCD"
    for bad in ['"\\400"', '"\\uD800"', '"\\x4"', '"abc', '"a"b"']:
        with pytest.raises(ValueError):
            unquote_go(bad)
