"""perfdiag's own activity never reaches the events table nor the summary: the hook's frames
and what runs inside them, and the hook's own thread, are dropped on import; their time on a
training thread is idle, not the frame's around it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest

from perfdiag.engine.kineto import read_kineto
from perfdiag.engine.kineto.own_events import OWN_TIME_CAT, OWN_TIME_NAME
from perfdiag.engine.summary import summarize

GPT2 = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "gpu-gpt2"
MAIN, HOOK_THREAD = 536, 564
HOOK = "perfdiag/collector/hook"
STEP_US = 10_000


def _event(name: str, ts: float, dur: float, *, tid: int = MAIN, cat: str = "python_function"):
    return {"ph": "X", "cat": cat, "name": name, "pid": MAIN, "tid": tid, "ts": ts, "dur": dur}


def _boundary(at: float, held_us: float) -> list[dict[str, Any]]:
    """The optimizer post hook at a step boundary, its counter read held `held_us` (a CPU quota
    throttling the thread there), inside torch's optimizer wrapper."""
    return [
        _event("torch/optim/optimizer.py(512): wrapper", at - 100, held_us + 200),
        _event(f"{HOOK}/__init__.py(169): optimizer_step", at, held_us + 20),
        _event(f"{HOOK}/window.py(141): _mark", at + 5, held_us + 10),
        _event("<built-in function thread_time_ns>", at + 10, held_us),
    ]


def _trace(tmp_path: Path, *, with_hook: bool = True, held_us: float = 3000) -> Path:
    steps = 3
    events: list[dict[str, Any]] = [
        _event("train.py(98): train", 0, steps * STEP_US + 1000),
    ]
    for n in range(steps):
        start = 500 + n * STEP_US
        events.append(_event(f"ProfilerStep#{n + 1}", start, STEP_US, cat="user_annotation"))
        events.append(_event("aten::mm", start + 100, 4000, cat="cpu_op"))
        if with_hook:
            events += _boundary(start + STEP_US - held_us - 300, held_us)
    if with_hook:  # the hook's daemon thread, waiting on its Event the whole time
        span = steps * STEP_US + 1000
        events += [
            _event("threading.py(1030): _bootstrap", 0, span, tid=HOOK_THREAD),
            _event("threading.py(1010): run", 1, span - 2, tid=HOOK_THREAD),
            _event(f"{HOOK}/__init__.py(346): _run", 2, span - 4, tid=HOOK_THREAD),
            _event("threading.py(359): wait", 3, span - 6, tid=HOOK_THREAD),
            _event(
                "<built-in method acquire of _thread.lock object at 0x7f0c9f7bebc0>",
                4,
                span - 8,
                tid=HOOK_THREAD,
            ),
            _event(f"{HOOK}/__init__.py(473): _write_heartbeat", 5000, 200, tid=HOOK_THREAD),
        ]
    path = tmp_path / "rank-0.json"
    path.write_text(json.dumps({"traceEvents": events, "baseTimeNanoseconds": 10**18}))
    return path


def test_the_hooks_frames_and_thread_are_dropped(tmp_path: Path) -> None:
    events, meta = read_kineto(_trace(tmp_path))
    names = events["name"].to_pylist()
    assert not [n for n in names if "perfdiag/" in n]
    assert "<built-in function thread_time_ns>" not in names  # inside the hook's frame
    # The training's own frames stay, those around the hook's frame too.
    assert {"train.py(98): train", "torch/optim/optimizer.py(512): wrapper", "aten::mm"} <= set(
        names
    )
    own = events.filter(pc.equal(events["kineto_cat"], OWN_TIME_CAT))
    assert set(own["name"].to_pylist()) == {OWN_TIME_NAME}
    # One per step boundary on the training thread; on the hook's thread (threading.py and the
    # lock wait around and under its _run gone) one for its heartbeat write.
    assert own["tid"].to_pylist() == [MAIN] * 3 + [HOOK_THREAD]
    assert events.filter(pc.equal(events["tid"], HOOK_THREAD)).num_rows == 1
    assert (own["ts_ns"][3].as_py() - 10**18, own["dur_ns"][3].as_py()) == (5_000_000, 200_000)
    assert meta.python_stacks


def test_the_hooks_time_is_idle_not_the_frame_around_it(tmp_path: Path) -> None:
    held_ms = 3.0
    events, meta = read_kineto(_trace(tmp_path, held_us=held_ms * 1000))
    summary = {row["function"]: row for row in summarize(events, meta).to_pylist()}
    assert not [f for f in summary if "perfdiag" in f or "thread_time_ns" in f]
    # Each step's hook call (its counter read held 3 ms) is idle, not thread_time_ns's; so is
    # the heartbeat write of the hook's thread (0.2 ms, the GIL held), not train.py's.
    idle = summary["<idle>"]
    assert idle["time_ms"] == pytest.approx(3 * (held_ms + 0.02) + 0.2, abs=0.01)
    assert idle["count"] == 0
    wrapper = summary["torch/optim/optimizer.py(512): wrapper"]
    assert wrapper["time_ms"] == pytest.approx(3 * 0.18, abs=0.01)  # its own 180 µs a step
    # The hook thread's wait no longer outranks the training thread's own frame.
    assert not [f for f in summary if "acquire" in f]
    train = summary["train.py(98): train"]
    window_ms = sum(meta.window.step_times_ms)
    assert train["time_ms"] == pytest.approx(window_ms - idle["time_ms"] - 3 * 4.18, abs=0.01)


def test_a_trace_without_the_hook_is_left_as_it_is(tmp_path: Path) -> None:
    events, _ = read_kineto(_trace(tmp_path, with_hook=False))
    assert OWN_TIME_CAT not in events["kineto_cat"].to_pylist()
    assert events.num_rows == 7  # train.py's frame, and a ProfilerStep and an aten::mm a step


def test_a_real_gpu_trace_keeps_nothing_of_the_hook() -> None:
    """../shared/traces/gpu-gpt2/healthy/rank-0: the hook's thread is 564, the training's 536."""
    path = GPT2 / "healthy" / "rank-0.json.gz"
    assert path.is_file(), f"the shared GPU traces are required ({path})"
    events, meta = read_kineto(path)
    assert not [n for n in events["name"].to_pylist() if "perfdiag/" in n]
    own = events.filter(pc.equal(events["kineto_cat"], OWN_TIME_CAT))
    # On the training thread, one event holds the hook's time where it started the profiler
    # and at each of the 11 step ends it marked (ProfilerStep#5 … #15); on the hook's thread,
    # nothing but its plan polls and heartbeat writes.
    assert own.filter(pc.equal(own["tid"], MAIN)).num_rows == 12
    hook_thread = events.filter(pc.equal(events["tid"], HOOK_THREAD))
    assert hook_thread.num_rows == own.num_rows - 12 > 0
    assert set(hook_thread["kineto_cat"].to_pylist()) == {OWN_TIME_CAT}
    functions = summarize(events, meta)["function"].to_pylist()
    assert not [f for f in functions if "perfdiag" in f or "_thread.lock" in f]
