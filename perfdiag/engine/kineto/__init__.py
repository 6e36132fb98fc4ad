"""Import of Kineto traces (torch.profiler's Chrome-trace JSON, optionally gzipped).

`read_kineto` reads a user's trace file as one worker's window; the agent uses the same parts
(`load_trace`, `build_events`) on the hook's windows.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeGuard

import pyarrow as pa
import pyarrow.compute as pc

from perfdiag.api import taxonomy
from perfdiag.api.limits import MAX_RANKS, rank_problem, world_size_problem
from perfdiag.api.schema import EVENTS_SCHEMA, EVENTS_SCHEMA_ID, WindowMeta, WorkerMeta, with_meta
from perfdiag.engine.allocator import system_allocator
from perfdiag.engine.kineto.events import (
    StepSpan,
    build_events,
    distributed_info,
    profiler_steps,
    rank_from_name,
    step_bounds,
    trace_span,
)
from perfdiag.engine.kineto.parse import RAW_SCHEMA, RawTrace, TraceError, load_trace

__all__ = [
    "RAW_SCHEMA",
    "RawTrace",
    "StepSpan",
    "TraceError",
    "build_events",
    "load_trace",
    "profiler_steps",
    "read_kineto",
    "step_bounds",
    "trace_events",
    "trace_rank",
    "worker_meta",
]


def read_kineto(path: Path, *, rank: int | None = None) -> tuple[pa.Table, WorkerMeta]:
    """A user's Kineto trace as (events table with metadata, WorkerMeta).

    The window is the trace's ProfilerStep#N ranges (all of them), or the whole trace as one
    step when it has none. The rank is `rank`, else `distributedInfo.rank`, else the file name
    (`rank-3.…json.gz`). Raises TraceError, naming the file and the problem, on malformed input.
    """
    with system_allocator(), taxonomy.same_columns():
        return _read_kineto(path, rank)


def _read_kineto(path: Path, rank: int | None) -> tuple[pa.Table, WorkerMeta]:
    return trace_events(load_trace(path), rank)


def trace_events(raw: RawTrace, rank: int | None = None) -> tuple[pa.Table, WorkerMeta]:
    """read_kineto of a trace already parsed."""
    path = raw.path
    global_rank = trace_rank(raw, rank)
    world = distributed_info(raw.header).get("world_size")
    problem = rank_problem(global_rank) or (
        world_size_problem(world) if _is_int(world) and world > MAX_RANKS else None
    )
    if problem is not None:
        raise TraceError(f"{path}: {problem}")
    steps = profiler_steps(raw)
    if steps:
        bounds = step_bounds(path, steps)
        start_step = steps[0].number
    else:
        bounds = [trace_span(raw)]
        start_step = 0
    window_id = raw.header.get("trace_id")
    window = WindowMeta(
        id=str(window_id) if isinstance(window_id, str) and window_id else path.name,
        start_step=start_step,
        steps=len(bounds),
        step_bounds_ns=bounds,
    )
    events = build_events(raw, global_rank, bounds)
    meta = worker_meta(raw, global_rank, window, events)
    return events.replace_schema_metadata(
        with_meta(EVENTS_SCHEMA, EVENTS_SCHEMA_ID, meta).metadata
    ), meta


def trace_rank(raw: RawTrace, rank: int | None) -> int:
    if rank is not None:
        return rank
    found = distributed_info(raw.header).get("rank")
    if _is_int(found) and found >= 0:
        return found
    from_name = rank_from_name(raw.path)
    if from_name is not None:
        return from_name
    raise TraceError(
        f"{raw.path}: cannot tell the rank: the trace has no distributedInfo.rank and the file "
        "name has no rank-<N> (rename it like rank-3.json.gz, or pass the rank)"
    )


def worker_meta(
    raw: RawTrace,
    rank: int,
    window: WindowMeta,
    events: pa.Table,
    **fields: object,
) -> WorkerMeta:
    """WorkerMeta of a Kineto trace; `fields` override what the trace says."""
    info = distributed_info(raw.header)
    world = info.get("world_size")
    host = raw.header.get("host_name")
    host_pids = pc.filter(events["pid"], pc.is_null(events["device"]))
    pid = None
    if len(host_pids):
        counts = pc.value_counts(host_pids).to_pylist()
        pid = max(counts, key=lambda c: c["counts"])["values"]
    values: dict[str, object] = {
        "rank": rank,
        "world_size": world if _is_int(world) and 0 < world <= MAX_RANKS else None,
        "host": host if isinstance(host, str) and host else None,
        "pid": pid,
        "window": window,
        "source": "kineto",
        "source_file": str(raw.path),
        "python_stacks": bool(pc.any(pc.equal(events["kineto_cat"], "python_function")).as_py()),
        "has_gpu": bool(pc.any(pc.is_valid(events["device"])).as_py()),
    }
    values.update(fields)
    return WorkerMeta.model_validate(values)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)
