"""A window captured by the hook in a real training process loaded through sitecustomize."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from perfdiag.api.plan import Plan
from perfdiag.collector.hook import spool

pytestmark = pytest.mark.slow


def test_capture_with_dataloader_gc_and_python_stacks(
    hooked: Any, baseline: Callable[..., dict[str, Any]]
) -> None:
    args = ("--steps", "14", "--dataloader", "--workers", "2", "--gc")
    gate = hooked.tmp / "gate"
    beat_path = spool.rank_dir(hooked.spool, 3) / spool.HEARTBEAT
    training = hooked.start(
        *args,
        *("--gate-step", "4", "--gate-marker", str(gate), "--gate-heartbeat", str(beat_path)),
        *("--gate-plan", "cap1", "--gate-phases", "armed"),
        env=hooked.env(RANK="3", LOCAL_RANK="1", WORLD_SIZE="4", POD_NAME="pod-a"),
    )
    hooked.wait_until(gate.exists, "the training to reach step 4")
    hooked.write_plan(Plan.new(plan_id="cap1", steps=3, python_stacks=True))
    finished = training.finish()
    assert finished.result == baseline(*args)  # bit-identical losses and parameters
    assert finished.hook_log() == []

    meta = hooked.hook_meta("cap1", rank=3)
    assert meta is not None and meta["error"] is None, meta
    pid = int(gate.read_text())
    assert (meta["rank"], meta["local_rank"], meta["world_size"]) == (3, 1, 4)
    assert (meta["pod"], meta["pid"], meta["python_stacks"]) == ("pod-a", pid, True)
    # Armed during step 4: the window starts when step 5 begins; step 5 is the warm-up.
    assert (meta["first_step"], meta["steps"]) == (5, 3)
    marks = meta["step_marks"]
    assert [mark["step"] for mark in marks] == [5, 6, 7, 8, 9]
    assert meta["plan"]["id"] == "cap1"

    events = hooked.trace_events("cap1", rank=3)
    assert hooked.profiler_steps(events) == [5, 6, 7, 8]
    names = {str(event.get("name")) for event in events}
    assert any(name.startswith("enumerate(DataLoader)") for name in names), "DataLoader waits"
    assert any(event.get("cat") == "python_function" for event in events)
    full_collections = [record for record in meta["gc"] if record["generation"] == 2]
    assert len(full_collections) >= 4  # gc.collect() in each of the 4 profiled steps
    for record in meta["gc"]:
        assert (
            marks[0]["clock_ns"] <= record["start_ns"] <= record["end_ns"] <= marks[-1]["clock_ns"]
        )
        assert record["tid"] == pid

    beat = hooked.heartbeat(rank=3)
    assert beat["pid"] == pid and beat["exited"] is True
    assert (beat["step"], beat["phase"], beat["plan_id"]) == (14, "dormant", "cap1")
    assert spool.ranks_in(hooked.spool) == [3]  # DataLoader workers wrote nothing


def test_window_cut_short_by_the_end_of_training_is_reported(hooked: Any) -> None:
    gate = hooked.tmp / "gate"
    training = hooked.start(
        *("--steps", "6", "--gate-step", "2", "--gate-marker", str(gate)),
        *("--gate-heartbeat", str(spool.rank_dir(hooked.spool, 0) / spool.HEARTBEAT)),
        *("--gate-plan", "long", "--gate-phases", "armed"),
    )
    hooked.wait_until(gate.exists, "the training to reach step 2")
    hooked.write_plan(Plan.new(plan_id="long", steps=20))
    finished = training.finish()
    assert finished.result["losses"]
    meta = hooked.hook_meta("long")
    assert meta is not None
    assert meta["error"] == "the process exited after 3 of the window's 21 steps"
    assert [mark["step"] for mark in meta["step_marks"]] == [3, 4, 5, 6]
    assert not (spool.window_dir(hooked.spool, 0, "long") / spool.TRACE).exists()
    beat = hooked.heartbeat()
    assert (beat["phase"], beat["plan_id"], beat["exited"]) == ("failed", "long", True)
    assert sum("the process exited" in line for line in finished.hook_log()) == 1


def test_window_waits_for_the_plans_start_step(hooked: Any) -> None:
    gate = hooked.tmp / "gate"
    training = hooked.start(
        *("--steps", "14", "--gate-step", "2", "--gate-marker", str(gate)),
        *("--gate-heartbeat", str(spool.rank_dir(hooked.spool, 0) / spool.HEARTBEAT)),
        *("--gate-plan", "later", "--gate-phases", "armed"),
    )
    hooked.wait_until(gate.exists, "the training to reach step 2")
    hooked.write_plan(Plan.new(plan_id="later", steps=2, start_step=8))
    finished = training.finish()
    assert finished.hook_log() == []
    meta = hooked.hook_meta("later")
    assert meta is not None and meta["error"] is None, meta
    # Armed during step 2, but the window begins at step 8 as the plan says (8 is the warm-up).
    assert meta["first_step"] == 8
    assert hooked.profiler_steps(hooked.trace_events("later")) == [8, 9, 10]


def test_a_rank_past_the_start_step_begins_at_its_next_step(hooked: Any) -> None:
    gate = hooked.tmp / "gate"
    training = hooked.start(
        *("--steps", "10", "--gate-step", "4", "--gate-marker", str(gate)),
        *("--gate-heartbeat", str(spool.rank_dir(hooked.spool, 0) / spool.HEARTBEAT)),
        *("--gate-plan", "past", "--gate-phases", "armed"),
    )
    hooked.wait_until(gate.exists, "the training to reach step 4")
    hooked.write_plan(Plan.new(plan_id="past", steps=2, start_step=1))
    training.finish()
    meta = hooked.hook_meta("past")
    assert meta is not None and meta["error"] is None, meta
    assert meta["first_step"] == 5
