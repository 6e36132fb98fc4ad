"""Critical path by priority sweep, on hand-built event sets whose answer is known."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from perfdiag.engine.critical_path import IDLE, critical_path, max_cover


def charged(events: Any, bounds: list[tuple[int, int]]) -> dict[tuple[str, int], int]:
    """{(event name or "<idle>", step): ns} of the critical path."""
    result = critical_path(events, bounds)
    names = events["name"].to_pylist()
    out: dict[tuple[str, int], int] = {}
    for event, step, ns in zip(result.event, result.step, result.ns, strict=True):
        key = ("<idle>" if event == IDLE else names[event], int(step))
        out[key] = out.get(key, 0) + int(ns)
    assert sum(out.values()) == result.window_ns
    return out


def totals(charges: dict[tuple[str, int], int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for (name, _), ns in charges.items():
        out[name] = out.get(name, 0) + ns
    return out


def test_nested_events_charge_self_time(make_events: Any) -> None:
    events = make_events(
        [
            dict(
                name="main", category="python", kineto_cat="python_function", ts=0, dur=100, tid=1
            ),
            dict(name="aten::linear", category="cpu_op", kineto_cat="cpu_op", ts=10, dur=50, tid=1),
            dict(name="aten::addmm", category="cpu_op", kineto_cat="cpu_op", ts=20, dur=20, tid=1),
        ]
    )
    assert totals(charged(events, [(0, 100)])) == {
        "main": 50,
        "aten::linear": 30,
        "aten::addmm": 20,
    }


def test_idle_and_containers(make_events: Any) -> None:
    events = make_events(
        [
            dict(
                name="ProfilerStep#4",
                category="annotation",
                kineto_cat="user_annotation",
                ts=0,
                dur=100,
                tid=1,
            ),
            dict(
                name="Optimizer.step#SGD.step",
                category="annotation",
                kineto_cat="user_annotation",
                ts=60,
                dur=40,
                tid=1,
            ),
            dict(name="aten::mm", category="cpu_op", kineto_cat="cpu_op", ts=10, dur=20, tid=1),
            dict(name="aten::add_", category="cpu_op", kineto_cat="cpu_op", ts=70, dur=10, tid=1),
            dict(
                name="## forward ##",
                category="annotation",
                kineto_cat="user_annotation",
                ts=5,
                dur=40,
                tid=1,
            ),
        ]
    )
    # Containers are never charged; a user range is (its self time); gaps are idle.
    assert totals(charged(events, [(0, 100)])) == {
        "aten::mm": 20,
        "aten::add_": 10,
        "## forward ##": 20,
        "<idle>": 50,
    }


def test_priority_across_threads_and_streams(make_events: Any) -> None:
    events = make_events(
        [
            dict(
                name="kernel",
                category="gpu_compute",
                kineto_cat="kernel",
                ts=0,
                dur=40,
                pid=0,
                tid=7,
                device=0,
            ),
            dict(
                name="ncclKernel_AllReduce",
                category="communication",
                kineto_cat="kernel",
                ts=20,
                dur=50,
                pid=0,
                tid=20,
                device=0,
            ),
            dict(
                name="Memcpy HtoD",
                category="gpu_memory",
                kineto_cat="gpu_memcpy",
                ts=60,
                dur=20,
                pid=0,
                tid=9,
                device=0,
            ),
            dict(
                name="cudaLaunchKernel",
                category="cuda_runtime",
                kineto_cat="cuda_runtime",
                ts=0,
                dur=100,
                tid=1,
            ),
        ]
    )
    assert totals(charged(events, [(0, 100)])) == {
        "kernel": 40,  # GPU compute hides communication and host work
        "ncclKernel_AllReduce": 20,  # 40-60: communication on the GPU over host work
        "Memcpy HtoD": 20,  # 60-80: GPU memory over communication
        "cudaLaunchKernel": 20,  # 80-100: only host work left
    }


def test_cpu_compute_hides_host_communication_but_waiting_is_communication(
    make_events: Any,
) -> None:
    # DDP on CPU: gloo all_reduce on its thread overlaps backward ops on the main thread;
    # after the ops, the main thread waits inside a Python frame.
    events = make_events(
        [
            dict(
                name="backward",
                category="python",
                kineto_cat="python_function",
                ts=0,
                dur=100,
                tid=1,
            ),
            dict(name="aten::mm", category="cpu_op", kineto_cat="cpu_op", ts=0, dur=60, tid=1),
            dict(
                name="gloo:all_reduce",
                category="communication",
                kineto_cat="user_annotation",
                ts=30,
                dur=60,
                tid=2,
            ),
        ]
    )
    assert totals(charged(events, [(0, 100)])) == {
        "aten::mm": 60,
        "gloo:all_reduce": 30,  # 60-90: the main thread only waits
        "backward": 10,
    }


def test_enclosing_spans_exact(make_events: Any) -> None:
    events = make_events(
        [
            dict(
                name="step", category="python", kineto_cat="python_function", ts=0, dur=100, tid=1
            ),
            dict(
                name="enumerate(DataLoader)#it",
                category="dataloader",
                kineto_cat="user_annotation",
                ts=0,
                dur=40,
                tid=1,
            ),
            dict(name="aten::stack", category="cpu_op", kineto_cat="cpu_op", ts=10, dur=20, tid=1),
            dict(name="aten::mm", category="cpu_op", kineto_cat="cpu_op", ts=45, dur=40, tid=1),
            dict(name="gc.collect(gen=2)", category="gc", kineto_cat="gc", ts=50, dur=30, tid=1),
            dict(
                name="c10d::allreduce_",
                category="communication",
                kineto_cat="cpu_op",
                ts=90,
                dur=10,
                tid=1,
            ),
            dict(name="aten::copy_", category="cpu_op", kineto_cat="cpu_op", ts=92, dur=5, tid=1),
        ]
    )
    assert totals(charged(events, [(0, 100)])) == {
        "enumerate(DataLoader)#it": 40,  # the batch assembly inside is data loading
        "step": 10,  # 40-45 and 85-90
        "aten::mm": 10,  # 45-50 and 80-85: the GC pause inside it is GC time
        "gc.collect(gen=2)": 30,
        "c10d::allreduce_": 10,  # the copy inside the collective is communication
    }


def test_window_clipping_steps_and_gaps(make_events: Any) -> None:
    events = make_events(
        [
            dict(name="long_op", category="cpu_op", kineto_cat="cpu_op", ts=-50, dur=100, tid=1),
            dict(name="late_op", category="cpu_op", kineto_cat="cpu_op", ts=90, dur=100, tid=1),
        ]
    )
    result = charged(events, [(0, 40), (40, 80), (120, 130)])
    assert result == {
        ("long_op", 0): 40,
        ("long_op", 1): 10,
        ("<idle>", 1): 30,
        ("late_op", 2): 10,  # 80-120 lies between the steps: not in the window
    }
    summary = critical_path(events, [(0, 40), (40, 80), (120, 130)])
    assert summary.window_ns == 90
    assert list(summary.step_ns) == [40, 40, 10]
    assert list(summary.idle_per_step()) == [0, 30, 0]


def test_identical_start_prefers_the_shorter_inner_event(make_events: Any) -> None:
    events = make_events(
        [
            dict(name="outer", category="cpu_op", kineto_cat="cpu_op", ts=0, dur=50, tid=1),
            dict(name="inner", category="cpu_op", kineto_cat="cpu_op", ts=0, dur=20, tid=1),
        ]
    )
    assert totals(charged(events, [(0, 50)])) == {"inner": 20, "outer": 30}


def test_no_events_is_all_idle(make_events: Any) -> None:
    events = make_events([])
    assert charged(events, [(0, 10), (10, 30)]) == {("<idle>", 0): 10, ("<idle>", 1): 20}


def test_parallel_host_threads_same_class_latest_start_wins(make_events: Any) -> None:
    events = make_events(
        [
            dict(name="a", category="cpu_op", kineto_cat="cpu_op", ts=0, dur=60, tid=1),
            dict(name="b", category="cpu_op", kineto_cat="cpu_op", ts=20, dur=60, tid=2),
        ]
    )
    assert totals(charged(events, [(0, 100)])) == {"a": 20, "b": 60, "<idle>": 20}


def brute_force_cover(left: list[int], right: list[int], key: list[int], n: int) -> list[int]:
    out = [-1] * n
    for lo, hi, k in zip(left, right, key, strict=True):
        for i in range(lo, hi):
            out[i] = max(out[i], k)
    return out


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(min_value=1, max_value=70),
    intervals=st.lists(st.tuples(st.integers(0, 70), st.integers(0, 70)), max_size=40),
)
def test_max_cover_matches_brute_force(n: int, intervals: list[tuple[int, int]]) -> None:
    left = [min(a, b, n) for a, b in intervals]
    right = [min(max(a, b), n) for a, b in intervals]
    key = list(range(len(intervals)))
    np.random.default_rng(len(intervals)).shuffle(key)
    expected = brute_force_cover(left, right, key, n)
    got = max_cover(
        np.array(left, dtype=np.int64),
        np.array(right, dtype=np.int64),
        np.array(key, dtype=np.int64),
        n,
    )
    assert got.tolist() == expected


def brute_force_path(spans: list[tuple[int, int, bool, int, int]], horizon: int) -> list[int]:
    """Unit-by-unit reference: per lane the covering span that is enclosing (communication),
    then latest-started, then shortest; across lanes the highest class, then the latest start.
    spans: (lane, class, enclosing, ts, end)."""
    owners = []
    for t in range(horizon):
        best_per_lane: dict[int, tuple[bool, int, int, int]] = {}
        for i, (lane, _, enclosing, ts, end) in enumerate(spans):
            if ts <= t < end:
                key = (enclosing, ts, -(end - ts), i)
                if lane not in best_per_lane or key > best_per_lane[lane]:
                    best_per_lane[lane] = key
        if not best_per_lane:
            owners.append(-1)
            continue
        winners = [(spans[k[3]][1], k[1], k[3]) for k in best_per_lane.values()]
        owners.append(max(winners)[2])
    return owners


CLASSES = {"cpu_op": 3, "python": 1, "communication": 2}


@settings(max_examples=150, deadline=None)
@given(
    spans=st.lists(
        st.tuples(
            st.integers(1, 3),
            st.sampled_from(sorted(CLASSES)),
            st.integers(0, 40),
            st.integers(1, 25),
        ),
        max_size=25,
    )
)
def test_critical_path_matches_unit_by_unit_reference(
    make_events: Any, spans: list[tuple[int, str, int, int]]
) -> None:
    # Distinct (ts, dur) per lane keep the reference's tie-breaks unambiguous.
    seen: set[tuple[int, int, int]] = set()
    unique = []
    for lane, category, ts, dur in spans:
        if (lane, ts, dur) not in seen:
            seen.add((lane, ts, dur))
            unique.append((lane, category, ts, dur))
    rows = [
        dict(
            name=f"e{i}",
            category=c,
            kineto_cat="cpu_op" if c != "python" else "python_function",
            ts=ts,
            dur=dur,
            tid=lane,
        )
        for i, (lane, c, ts, dur) in enumerate(unique)
    ]
    events = make_events(rows)
    horizon = 70
    expected = brute_force_path(
        [(lane, CLASSES[c], c == "communication", ts, ts + dur) for lane, c, ts, dur in unique],
        horizon,
    )
    result = critical_path(events, [(0, horizon)])
    got: dict[int, int] = {}
    for event, ns in zip(result.event, result.ns, strict=True):
        got[int(event)] = got.get(int(event), 0) + int(ns)
    want: dict[int, int] = {}
    for owner in expected:
        want[owner] = want.get(owner, 0) + 1
    assert got == want


def test_sums_to_the_window_on_real_traces(hta_files: list[Any]) -> None:
    from perfdiag.engine.kineto import read_kineto

    events, meta = read_kineto(next(f for f in hta_files if "trace_filter" in str(f)))
    bounds = meta.window.step_bounds_ns
    result = critical_path(events, bounds)
    assert result.ns.sum() == result.window_ns == sum(e - s for s, e in bounds)
    assert (result.ns > 0).all()
    per_step = np.bincount(result.step, weights=result.ns)
    assert per_step.tolist() == [e - s for s, e in bounds]
