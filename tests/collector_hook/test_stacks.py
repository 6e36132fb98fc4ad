"""`stacks` plans are answered by the hook's thread while the training thread is blocked."""

from __future__ import annotations

from typing import Any

import pytest

from perfdiag.api.plan import Plan
from perfdiag.collector.hook import spool

pytestmark = pytest.mark.slow


def test_stacks_while_the_main_thread_blocks(hooked: Any) -> None:
    gate, release = hooked.tmp / "gate", hooked.tmp / "release"
    training = hooked.start(
        *("--steps", "6", "--gate-step", "3", "--gate-marker", str(gate)),
        *("--block-until", str(release)),
    )
    hooked.wait_until(gate.exists, "the training to block in step 3")
    hooked.write_plan(Plan.new(action="stacks", plan_id="s1"))
    path = spool.stacks_file(hooked.spool, 0, "s1")
    dump = hooked.wait_until(lambda: spool.read_json(path), "the stack dump")
    still_blocked = training.proc.poll() is None and not release.exists()
    release.touch()
    finished = training.finish()
    assert finished.result["losses"] and still_blocked
    assert finished.hook_log() == []

    assert (dump["rank"], dump["pid"], dump["plan_id"]) == (0, int(gate.read_text()), "s1")
    assert dump["step"] == 3  # three steps done; blocked inside the fourth
    main = dump["threads"][0]
    assert main["main"] is True and main["name"] == "MainThread"
    functions = [frame["function"] for frame in main["frames"]]
    assert functions[-2:] == ["main", "block_here"], functions  # innermost last
    assert main["frames"][-1]["file"].endswith("train_loop.py")
    assert isinstance(main["frames"][-1]["line"], int)
    assert any(thread["name"] == "perfdiag-hook" for thread in dump["threads"])
    # A stacks plan is answered once, and a capture is not started by it.
    assert not (spool.rank_dir(hooked.spool, 0) / "windows" / "s1").exists()
    beat = hooked.heartbeat()
    assert beat["phase"] == "dormant" and beat["step"] == 6


def test_heartbeat_says_where_a_late_step_is_blocked(hooked: Any) -> None:
    gate, release = hooked.tmp / "gate", hooked.tmp / "release"
    training = hooked.start(
        *("--steps", "5", "--gate-step", "2", "--gate-marker", str(gate)),
        *("--block-until", str(release)),
    )
    hooked.wait_until(gate.exists, "the training to block in step 2")
    # Once the step is 2 s late, the heartbeat carries the training thread's innermost frame.
    beat = hooked.wait_until(
        lambda: (b := hooked.heartbeat()) and b.get("blocked_in") and b, "a late heartbeat"
    )
    hooked.write_plan(Plan.new(action="stacks", plan_id="s2"))
    dump = hooked.wait_until(
        lambda: spool.read_json(spool.stacks_file(hooked.spool, 0, "s2")), "the stack dump"
    )
    release.touch()
    finished = training.finish()
    assert finished.hook_log() == []
    assert beat["blocked_in"]["function"] == "block_here"
    assert beat["blocked_in"]["file"].endswith("train_loop.py")
    assert beat["blocked_in"]["collective"] is None  # not inside torch.distributed
    training_threads = [t for t in dump["threads"] if t["training"]]
    assert [t["name"] for t in training_threads] == ["MainThread"]
    # No process group in this single-process loop: no Flight Recorder dump.
    assert "flight_recorder" not in dump
    assert not spool.flight_recorder_file(hooked.spool, 0, "s2").exists()
    # Heartbeats after the step advanced again no longer carry it.
    assert "blocked_in" not in hooked.heartbeat()
