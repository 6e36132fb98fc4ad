"""Failures of the hook never disturb the training: it completes with bit-identical results,
each failure is logged once, and the hook stays usable where it can."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from perfdiag.api.plan import Plan
from perfdiag.collector.hook import spool

pytestmark = pytest.mark.slow


def test_unwritable_spool(hooked: Any, baseline: Callable[..., dict[str, Any]]) -> None:
    blocker = hooked.tmp / "not-a-folder"
    blocker.write_text("a regular file where the spool's parent folder should be")
    hooked.write_plan(Plan.new(plan_id="u1", steps=2))
    args = ("--steps", "16", "--step-sleep", "0.15")
    training = hooked.start(*args, env=hooked.env(PERFDIAG_SPOOL=str(blocker / "spool")))
    finished = training.finish()
    assert finished.result == baseline(*args)
    log = finished.hook_log()
    # Heartbeats were tried every second (and at exit), the plan once: one line each.
    assert sum("cannot write heartbeats" in line for line in log) == 1, log
    assert sum("capture u1 not started" in line for line in log) == 1, log
    assert len(log) == 2, log


def test_malformed_plans_are_ignored_with_one_line_each(
    hooked: Any, baseline: Callable[..., dict[str, Any]]
) -> None:
    gate, release = hooked.tmp / "gate", hooked.tmp / "release"
    args = ("--steps", "10")
    training = hooked.start(
        *args, "--gate-step", "2", "--gate-marker", str(gate), "--block-until", str(release)
    )
    hooked.wait_until(gate.exists, "the training to reach step 2")
    valid = json.loads(Plan.new(plan_id="ok", steps=2).to_json())
    past = (datetime.now(timezone.utc) - timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    bad_plans = [
        ("{not json", "not valid JSON"),
        ({**valid, "steps": "many"}, "'steps' must be an integer in 1…1000, not 'many'"),
        ({**valid, "steps": 10**6}, "not 1000000"),
        ({**valid, "action": "explode"}, "'action' must be one of capture, stacks, watch"),
        ({**valid, "id": 42}, "'id' must be a string"),
        ({**valid, "extra": True}, "unknown plan field"),
        ({**valid, "python_stacks": "yes"}, "'python_stacks' must be true or false"),
        ({**valid, "id": "late", "deadline": past}, "plan late is past its deadline"),
    ]
    for content, expected in bad_plans:
        write_plan_text(hooked.plan, content)
        training.wait_log(expected)
    write_plan_text(hooked.plan, "{not json")  # the same failure again: no new line
    write_plan_text(hooked.plan, {**valid, "id": "ok2", "steps": 0})
    training.wait_log("'steps' must be an integer in 1…1000, not 0")
    # A valid plan is still carried out.
    write_plan_text(hooked.plan, Plan.new(plan_id="good", steps=2).to_json())
    hooked.wait_until(lambda: hooked.heartbeat().get("phase") == "armed", "the hook to arm")
    release.touch()
    finished = training.finish()
    assert finished.result == baseline(*args)
    log = finished.hook_log()
    assert len(log) == len(bad_plans) + 1, "\n".join(log)
    for _, expected in bad_plans:
        assert sum(expected in line for line in log) == 1, (expected, log)
    meta = hooked.hook_meta("good")
    assert meta is not None and meta["error"] is None
    assert meta["first_step"] == 3


def write_plan_text(path: Path, content: object) -> None:
    text = content if isinstance(content, str) else json.dumps(content)
    tmp = path.with_name(".plan.tmp")
    tmp.write_text(text)
    tmp.replace(path)


@pytest.mark.parametrize(
    ("option", "error"),
    [
        ("--user-profiler", "another torch profiler is already recording"),
        ("--break-profiler", "RuntimeError: torch.profiler broken for the test"),
    ],
)
def test_profiler_start_failure(
    hooked: Any, baseline: Callable[..., dict[str, Any]], option: str, error: str
) -> None:
    user_trace = hooked.tmp / "user.json"
    if option == "--user-profiler":
        args = ("--steps", "10", option, str(user_trace))
        reference_args = ("--steps", "10", option, str(hooked.tmp / "reference.json"))
    else:
        args = reference_args = ("--steps", "10", option)
    gate = hooked.tmp / "gate"
    training = hooked.start(
        *args,
        *("--gate-step", "2", "--gate-marker", str(gate)),
        *("--gate-heartbeat", str(spool.rank_dir(hooked.spool, 0) / spool.HEARTBEAT)),
        *("--gate-plan", "p1", "--gate-phases", "armed"),
    )
    hooked.wait_until(gate.exists, "the training to reach step 2")
    hooked.write_plan(Plan.new(plan_id="p1", steps=3))
    finished = training.finish()
    reference = baseline(*reference_args)
    assert finished.result["losses"] == reference["losses"]
    assert finished.result["params_sha256"] == reference["params_sha256"]
    if option == "--user-profiler":  # the user's own trace is whole, without our annotations
        assert finished.result["user_events"] == reference["user_events"]
        assert "ProfilerStep#" not in user_trace.read_text()
    meta = hooked.hook_meta("p1")
    assert meta is not None and error in meta["error"], meta
    assert meta["first_step"] == 3 and meta["step_marks"] == []
    assert not (spool.window_dir(hooked.spool, 0, "p1") / spool.TRACE).exists()
    beat = hooked.heartbeat()
    assert (beat["phase"], beat["plan_id"]) == ("failed", "p1") and error in beat["error"]
    assert sum(error in line for line in finished.hook_log()) == 1, finished.hook_log()


def test_plan_arriving_mid_step_starts_at_the_next_boundary(
    hooked: Any, baseline: Callable[..., dict[str, Any]]
) -> None:
    args = ("--steps", "9", "--explicit", "--two-optimizers", "--step-sleep", "0.05")
    gate = hooked.tmp / "gate"
    training = hooked.start(
        *args,
        *("--gate-step", "3", "--gate-marker", str(gate)),
        *("--gate-heartbeat", str(spool.rank_dir(hooked.spool, 0) / spool.HEARTBEAT)),
        *("--gate-plan", "mid", "--gate-phases", "armed"),
    )
    hooked.wait_until(gate.exists, "the training to be inside step 3")
    hooked.write_plan(Plan.new(plan_id="mid", steps=2))
    finished = training.finish()
    assert finished.result == baseline(*args)
    meta = hooked.hook_meta("mid")
    assert meta is not None and meta["error"] is None, meta
    # Armed while step 3 ran (after its forward pass): the window begins with step 4.
    assert [mark["step"] for mark in meta["step_marks"]] == [4, 5, 6, 7]
    assert hooked.profiler_steps(hooked.trace_events("mid")) == [4, 5, 6]
    assert finished.hook_log() == []
