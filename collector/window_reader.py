"""A window the hook wrote to the spool (collector/hook/spool.py) → events table and WorkerMeta.

The hook profiles steps n0 … n0+k, each marked by a "ProfilerStep#<n>" range; n0 is the
profiler's warm-up, so the window is steps n0+1 … n0+k. Its GC pauses, timed on the hook's
clock (perf_counter_ns), are placed on the trace clock with the step boundaries both clocks
saw: `step_marks` entry {"step": n, "clock_ns": t} is the moment step n began, which is where
ProfilerStep#n starts in the trace.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfdiag.api import taxonomy
from perfdiag.api.schema import EVENTS_SCHEMA, EVENTS_SCHEMA_ID, WindowMeta, WorkerMeta, with_meta
from perfdiag.collector.hook.spool import HOOK_META, TRACE
from perfdiag.engine.allocator import system_allocator
from perfdiag.engine.kineto.events import StepSpan, build_events, profiler_steps, step_bounds
from perfdiag.engine.kineto.parse import RAW_SCHEMA, RawTrace, TraceError, load_trace


def read_hook_window(
    window_dir: Path,
    hook: dict[str, Any],
    *,
    rank: int,
    plan_id: str,
    pod: str | None = None,
) -> tuple[pa.Table, WorkerMeta]:
    """Events (with metadata) and WorkerMeta of the window in `window_dir`, whose hook.json
    says `hook`. Raises TraceError when the window cannot be read."""
    with system_allocator(), taxonomy.same_columns():
        return _read_hook_window(window_dir, hook, rank=rank, plan_id=plan_id, pod=pod)


def _read_hook_window(
    window_dir: Path,
    hook: dict[str, Any],
    *,
    rank: int,
    plan_id: str,
    pod: str | None,
) -> tuple[pa.Table, WorkerMeta]:
    trace_path = window_dir / TRACE
    first_step = _int_field(trace_path, hook, "first_step")
    steps = _int_field(trace_path, hook, "steps")
    if steps < 1:
        raise TraceError(
            f"{window_dir / HOOK_META}: the window has no analysed step (steps={steps})"
        )
    raw = load_trace(trace_path)
    analysed = analysed_steps(raw, first_step, steps)
    bounds = step_bounds(trace_path, analysed)
    gc_events = gc_events_on_trace_clock(raw, hook)
    events = build_events(raw, rank, bounds, extra=gc_events)
    window = WindowMeta(
        id=plan_id,
        start_step=analysed[0].number,
        steps=len(bounds),
        step_bounds_ns=bounds,
    )
    meta = WorkerMeta(
        rank=rank,
        world_size=_optional_int(hook.get("world_size")),
        local_rank=_optional_int(hook.get("local_rank")),
        host=hook.get("host") if isinstance(hook.get("host"), str) else None,
        pod=pod,
        pid=_optional_int(hook.get("pid")),
        window=window,
        torch_version=hook.get("torch_version")
        if isinstance(hook.get("torch_version"), str)
        else None,
        source="hook",
        source_file=None,
        python_stacks=bool(hook.get("python_stacks", False)),
        has_gpu=bool(pc.any(pc.is_valid(events["device"])).as_py()),
    )
    return events.replace_schema_metadata(
        with_meta(EVENTS_SCHEMA, EVENTS_SCHEMA_ID, meta).metadata
    ), meta


STEP_COUNTERS = ("thread_cpu_ns", "thread_wait_ns", "process_cpu_ns")
"""The CPU counters the hook reads at each step boundary (collector/hook/spool.py, step_marks)."""


def step_counters_ms(hook: dict[str, Any], window: WindowMeta) -> dict[str, list[float]]:
    """Each counter of STEP_COUNTERS the hook read at every boundary of the window's analysed
    steps, as its increase in each step, ms. A counter missing or going backwards at any
    boundary is left out; all are left out when the analysed steps are not the hook's own
    (a trace that numbers its steps otherwise)."""
    marks = hook.get("step_marks")
    first = hook.get("first_step")
    if not isinstance(marks, list) or not isinstance(first, int):
        return {}
    if window.start_step != first + 1 or window.steps != hook.get("steps"):
        return {}
    by_step = {m.get("step"): m for m in marks if isinstance(m, dict)}
    boundaries = [
        by_step.get(n) for n in range(window.start_step, window.start_step + window.steps + 1)
    ]
    out: dict[str, list[float]] = {}
    for key in STEP_COUNTERS:
        read = [m.get(key) if m is not None else None for m in boundaries]
        values = [v for v in read if isinstance(v, int) and not isinstance(v, bool) and v >= 0]
        if len(values) != len(read):
            continue
        deltas = [b - a for a, b in itertools.pairwise(values)]  # Python ints: no overflow
        if all(0 <= d < 2**62 for d in deltas):
            out[key] = [round(d / 1e6, 4) for d in deltas]
    return out


def analysed_steps(raw: RawTrace, first_step: int, steps: int) -> list[StepSpan]:
    """The ProfilerStep ranges of steps first_step+1 … first_step+steps. When the trace numbers
    its steps otherwise, its ranges in order after the first (the warm-up) stand for them."""
    found = profiler_steps(raw)
    by_number = {s.number: s for s in found}
    wanted = [by_number.get(first_step + i) for i in range(1, steps + 1)]
    chosen = [s for s in wanted if s is not None]
    if len(chosen) == steps:
        return chosen
    if len(found) > 1 and not chosen:
        return found[1 : steps + 1]
    if chosen:
        return chosen
    raise TraceError(
        f"{raw.path}: no ProfilerStep#<n> ranges for the analysed steps {first_step + 1}…"
        f"{first_step + steps} (the trace has {len(found)} ProfilerStep range(s))"
    )


def clock_offset_ns(raw: RawTrace, hook: dict[str, Any]) -> int | None:
    """Trace clock − hook clock, from the step boundaries both saw (median over the steps),
    or None when they share no step."""
    marks = hook.get("step_marks")
    if not isinstance(marks, list):
        return None
    starts = {s.number: s.start_ns for s in profiler_steps(raw)}
    offsets = []
    for mark in marks:
        if not isinstance(mark, dict):
            continue
        step, clock = mark.get("step"), mark.get("clock_ns")
        if isinstance(step, int) and isinstance(clock, int) and step in starts:
            offsets.append(starts[step] - clock)
    if not offsets:
        return None
    return int(np.median(np.array(offsets, dtype=np.int64)))


def gc_events_on_trace_clock(raw: RawTrace, hook: dict[str, Any]) -> pa.Table | None:
    """The hook's GC records as events (RAW_SCHEMA, category "gc"), on the trace clock, on the
    thread that recorded them (the main thread when not said)."""
    records = hook.get("gc")
    if not isinstance(records, list) or not records:
        return None
    offset = clock_offset_ns(raw, hook)
    if offset is None:
        return None
    pid = _optional_int(hook.get("pid"))
    rows: dict[str, list[Any]] = {"name": [], "ts_ns": [], "dur_ns": [], "tid": []}
    for record in records:
        if not isinstance(record, dict):
            continue
        start, end = record.get("start_ns"), record.get("end_ns")
        if not isinstance(start, int) or not isinstance(end, int) or end < start:
            continue
        generation = record.get("generation")
        rows["name"].append(f"gc.collect(gen={generation})")
        rows["ts_ns"].append(start + offset)
        rows["dur_ns"].append(end - start)
        tid = record.get("tid")
        rows["tid"].append(tid if isinstance(tid, int) else pid)
    n = len(rows["name"])
    if not n or pid is None:
        return None
    columns: dict[str, Any] = {field.name: pa.nulls(n, field.type) for field in RAW_SCHEMA}
    columns["index"] = pa.array(np.full(n, -1, dtype=np.int64))
    columns["cat"] = pa.array(["gc"] * n, pa.string())
    columns["name"] = pa.array(rows["name"], pa.string())
    columns["pid"] = pa.array([pid] * n, pa.int64())
    columns["tid"] = pa.array(rows["tid"], pa.int64())
    columns["ts_ns"] = pa.array(rows["ts_ns"], pa.int64())
    columns["dur_ns"] = pa.array(rows["dur_ns"], pa.int64())
    return pa.table(columns, schema=RAW_SCHEMA)


def _int_field(path: Path, hook: dict[str, Any], field: str) -> int:
    value = hook.get(field)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise TraceError(f"{path.parent / HOOK_META}: field {field!r} is missing or not a count")
    return value


def _optional_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
