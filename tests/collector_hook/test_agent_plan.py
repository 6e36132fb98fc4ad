"""Where the hook reads its plan: the agent's copy of the pod's plan in the spool while the
agent keeps it fresh, else the plan file (the kubelet's downward-API file): one source at a
time, so that the kubelet's late file never brings back a plan already replaced."""

from __future__ import annotations

import os
import time
from pathlib import Path

from perfdiag.api.plan import Plan
from perfdiag.collector.hook import Hook, spool

IDENTITY = {"rank": 0, "local_rank": 0, "world_size": 1, "host": "h", "pod": "p", "pid": 1}


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_the_fresh_agent_copy_wins_and_a_stale_one_gives_way(tmp_path: Path) -> None:
    plan_file = tmp_path / "podinfo-plan"
    plan_file.write_text("")
    now = time.time()
    assert spool.plan_source(tmp_path, plan_file, now) == plan_file  # no agent copy
    mirror = spool.agent_plan_file(tmp_path)
    spool.write_bytes_atomic(mirror, b"", dir_mode=spool.AGENT_DIR_MODE)
    assert spool.plan_source(tmp_path, plan_file, time.time()) == mirror
    _age(mirror, spool.AGENT_PLAN_FRESH_S + 1)
    assert spool.plan_source(tmp_path, plan_file, time.time()) == plan_file
    _age(mirror, -(spool.AGENT_PLAN_FRESH_S + 1))  # a clock that jumped: not trusted either
    assert spool.plan_source(tmp_path, plan_file, time.time()) == plan_file
    assert spool.plan_source(tmp_path, None, time.time()) is None


def test_the_hook_arms_from_the_agent_copy_before_the_kubelet_file_shows_the_plan(
    tmp_path: Path,
) -> None:
    plan_file = tmp_path / "podinfo-plan"
    plan_file.write_text("")  # the kubelet has not refreshed the file yet
    mirror = spool.agent_plan_file(tmp_path)
    capture = Plan.new(plan_id="d-uid", steps=3, start_step=50)
    spool.write_bytes_atomic(mirror, capture.to_json().encode(), dir_mode=spool.AGENT_DIR_MODE)
    hook = Hook(tmp_path, plan_file, IDENTITY)
    hook._poll_plan()
    assert (hook.phase, hook.plan_id) == ("armed", "d-uid")

    # The agent went away (its copy stale): the kubelet's file is read, a plan already taken
    # is not taken again, a new one is.
    _age(mirror, spool.AGENT_PLAN_FRESH_S + 5)
    plan_file.write_text(capture.to_json())
    hook._poll_plan()
    assert hook.plan_id == "d-uid"
    plan_file.write_text(Plan.new(plan_id="d-uid-stacks", action="stacks").to_json())
    hook._poll_plan()
    assert spool.stacks_file(tmp_path, 0, "d-uid-stacks").is_file()


def test_a_fresh_agent_copy_without_a_plan_hides_the_kubelets_late_file(tmp_path: Path) -> None:
    """The capture ended and the plan is gone from the pod: the kubelet's file may still show
    it for a minute; the agent's fresh, empty copy is what the hook reads."""
    plan_file = tmp_path / "podinfo-plan"
    plan_file.write_text(Plan.new(plan_id="old", steps=3).to_json())
    spool.write_bytes_atomic(spool.agent_plan_file(tmp_path), b"", dir_mode=spool.AGENT_DIR_MODE)
    hook = Hook(tmp_path, plan_file, IDENTITY)
    hook._poll_plan()
    assert (hook.phase, hook.plan_id) == ("dormant", None)
