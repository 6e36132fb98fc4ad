"""A capture window in this process: files, step annotations, GC records, failures."""

from __future__ import annotations

import gc
import itertools
import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from perfdiag.collector.hook import spool
from perfdiag.collector.hook.plan import HookPlan
from perfdiag.collector.hook.profiler import (
    EXPORT_KINETO_SAVE,
    ProfilerBusy,
    ProfilerSession,
    profiler_enabled,
)
from perfdiag.collector.hook.window import CaptureWindow

IDENTITY = {"rank": 2, "local_rank": 0, "world_size": 4, "host": "h", "pod": "p", "pid": 7}


def make_plan(steps: int = 2, python_stacks: bool = False) -> HookPlan:
    return HookPlan("w1", "capture", steps, ("cpu", "cuda"), python_stacks, time.time() + 600)


def work() -> None:
    a = torch.randn(32, 32)
    (a @ a).relu().sum()


def run_window(folder: Path, first: int, plan: HookPlan) -> tuple[CaptureWindow, dict[str, Any]]:
    window = CaptureWindow(plan, {"id": plan.id}, first, folder, IDENTITY)
    window.start()
    step = first
    while True:
        work()
        gc.collect()
        step += 1
        if window.boundary(step):
            break
    return window, window.finish()


def test_window_writes_trace_and_meta(tmp_path: Path) -> None:
    folder = tmp_path / "w1"
    window, meta = run_window(folder, 7, make_plan(steps=2))
    assert window.error is None and meta["error"] is None
    assert not profiler_enabled()
    assert json.loads((folder / spool.HOOK_META).read_text()) == meta
    assert meta["first_step"] == 7 and meta["steps"] == 2 and meta["rank"] == 2
    assert meta["export"] == EXPORT_KINETO_SAVE  # the fast path works on the torch under test
    marks = meta["step_marks"]
    assert [m["step"] for m in marks] == [7, 8, 9, 10]
    assert all(a["clock_ns"] < b["clock_ns"] for a, b in itertools.pairwise(marks))
    collections = [r for r in meta["gc"] if r["generation"] == 2]
    assert len(collections) >= 3  # one gc.collect() per profiled step
    for record in meta["gc"]:
        assert (
            marks[0]["clock_ns"] <= record["start_ns"] <= record["end_ns"] <= marks[-1]["clock_ns"]
        )
    events = json.loads((folder / spool.TRACE).read_text())["traceEvents"]
    steps = sorted(e["name"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#"))
    assert steps == ["ProfilerStep#7", "ProfilerStep#8", "ProfilerStep#9"]
    assert any(e.get("name") == "aten::mm" for e in events)
    assert not [name for name in ("python_function",) if any(e.get("cat") == name for e in events)]
    assert window._on_gc not in gc.callbacks  # GC callback only during the window


def test_python_stacks_add_python_function_events(tmp_path: Path) -> None:
    _, meta = run_window(tmp_path / "w", 0, make_plan(steps=1, python_stacks=True))
    assert meta["error"] is None
    events = json.loads((tmp_path / "w" / spool.TRACE).read_text())["traceEvents"]
    assert any(e.get("cat") == "python_function" for e in events)


def test_unwritable_folder_ends_the_window_with_the_profiler_stopped(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where the spool folder should be")
    window = CaptureWindow(make_plan(steps=1), {}, 0, blocker / "w1", IDENTITY)
    window.start()
    work()
    window.boundary(1)
    work()
    assert window.boundary(2)
    with pytest.raises(OSError):
        window.finish()
    assert window.error is not None and "could not stop the profiler" in window.error
    assert not profiler_enabled()
    assert window._on_gc not in gc.callbacks


def test_a_user_profiler_is_left_alone(tmp_path: Path) -> None:
    user = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    user.start()
    try:
        window = CaptureWindow(make_plan(), {}, 0, tmp_path / "w", IDENTITY)
        with pytest.raises(ProfilerBusy):
            window.start()
        meta = window.abort("could not start the profiler")
        assert meta["error"] == "could not start the profiler"
        assert profiler_enabled()  # the user's profiler still records
        work()
    finally:
        user.stop()
    user.export_chrome_trace(str(tmp_path / "user.json"))
    events = json.loads((tmp_path / "user.json").read_text())["traceEvents"]
    assert any(e.get("name") == "aten::mm" for e in events)
    assert not any(str(e.get("name", "")).startswith("ProfilerStep#") for e in events)


def test_abort_stops_a_started_session() -> None:
    session = ProfilerSession(cuda=False, python_stacks=False)
    session.start()
    assert profiler_enabled()
    session.abort()
    assert not profiler_enabled()
    session.abort()  # twice is harmless


def test_step_marks_carry_the_training_threads_cpu_counters(tmp_path: Path) -> None:
    """Each boundary's counters give each step's own CPU and off-CPU time, exactly: a step that
    spins shows ~its length on-CPU, a step that sleeps shows almost none."""
    from perfdiag.api.schema import WindowMeta
    from perfdiag.collector.window_reader import STEP_COUNTERS, step_counters_ms

    plan = make_plan(steps=4)
    window = CaptureWindow(plan, {"id": plan.id}, 3, tmp_path / "w", IDENTITY)
    window.start()
    step = 3
    while True:
        step += 1
        if step % 2:
            time.sleep(0.03)
        else:
            end = time.thread_time() + 0.03
            while time.thread_time() < end:
                pass
        if window.boundary(step):
            break
    meta = window.finish()
    assert all(set(STEP_COUNTERS) <= set(m) for m in meta["step_marks"])
    window_meta = WindowMeta(id="w", start_step=4, steps=4, step_bounds_ns=[(0, 1)] * 4)
    per_step = step_counters_ms(meta, window_meta)
    assert set(per_step) == set(STEP_COUNTERS)
    # Step n's work runs before boundary n+1: steps 4 and 6 sleep, 5 and 7 spin.
    cpu = per_step["thread_cpu_ns"]
    assert cpu[0] < 10 and cpu[2] < 10, cpu
    assert cpu[1] >= 29 and cpu[3] >= 29, cpu
    assert all(p >= t - 0.5 for p, t in zip(per_step["process_cpu_ns"], cpu, strict=True)), per_step
    # A trace numbered otherwise, or a mark lost: no counter is guessed.
    assert step_counters_ms(meta, window_meta.model_copy(update={"start_step": 5})) == {}
    broken = dict(meta, step_marks=[m for m in meta["step_marks"] if m["step"] != 6])
    assert step_counters_ms(broken, window_meta) == {}
