"""A worker's CPU use per window step, from its hardware samples (`HostUsage` in its metadata).

The agent calls `host_usage(samples, meta, events)` when it writes a worker's summary. Counters
(ns of CPU, of run-queue wait, of cgroup throttling) are read at 1 ms to 20 ms; their value at a
step boundary is interpolated linearly between the samples around it, so that each step gets
its own share even when a step is shorter than the sampling period.

The training thread's run-queue wait is also split: the part that falls while a collective is in
flight (a communication event on any thread, or the training thread blocked in a collective's
`wait`) belongs to communication. On a busy host a thread woken when its collective completes
waits for a CPU before it runs again; that wait is not time outside communication.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from perfdiag.api.schema import HostUsage, WorkerMeta
from perfdiag.api.taxonomy import COLLECTIVE_WAIT_PREFIXES, COMMUNICATION


def _series(
    samples: pa.Table, metric: str, device: str
) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    mask = pc.and_(
        pc.equal(samples.column("metric"), metric), pc.equal(samples.column("device"), device)
    )
    rows = samples.filter(mask).sort_by("ts_ns")
    return (
        rows.column("ts_ns").to_numpy().astype(np.int64),
        rows.column("value").to_numpy(zero_copy_only=False).astype(np.float64),
    )


def _per_step_ms(
    samples: pa.Table, metric: str, device: str, bounds: NDArray[np.int64]
) -> list[float] | None:
    """The counter's increase within each step, ms (ns counters); None when the samples do not
    cover the window (then no step would be honest)."""
    ts, values = _series(samples, metric, device)
    if len(ts) < 2 or ts[0] > bounds[0, 0] or ts[-1] < bounds[-1, 1]:
        return None
    at_start = np.interp(bounds[:, 0], ts, values)
    at_end = np.interp(bounds[:, 1], ts, values)
    return [round(float(v), 4) for v in np.maximum(at_end - at_start, 0.0) / 1e6]


def _gauge(
    samples: pa.Table, metric: str, device: str, span: tuple[int, int]
) -> NDArray[np.float64]:
    ts, values = _series(samples, metric, device)
    return values[(ts >= span[0]) & (ts <= span[1])]


def _communication_intervals(events: pa.Table) -> NDArray[np.int64]:
    """(n, 2) merged [start, end) ns of the host's communication in flight: communication
    events on any host thread and the Python frames blocked in a collective's wait."""
    host = pc.is_null(events.column("device"))
    waiting = pc.equal(events.column("category"), COMMUNICATION)
    for prefix in COLLECTIVE_WAIT_PREFIXES:
        waiting = pc.or_(waiting, pc.starts_with(events.column("name"), prefix))
    rows = events.filter(pc.and_(host, pc.fill_null(waiting, False)))
    if rows.num_rows == 0:
        return np.zeros((0, 2), dtype=np.int64)
    start = rows.column("ts_ns").to_numpy().astype(np.int64)
    end = start + rows.column("dur_ns").to_numpy().astype(np.int64)
    order = np.argsort(start, kind="stable")
    start, end = start[order], np.maximum.accumulate(end[order])
    # A new merged interval begins where a start lies beyond every earlier end.
    begins = np.r_[True, start[1:] > end[:-1]]
    group = np.cumsum(begins) - 1
    merged_end = np.zeros(int(group[-1]) + 1, dtype=np.int64)
    np.maximum.at(merged_end, group, end)
    return np.stack([start[begins], merged_end], axis=1)


def _within_per_step(
    samples: pa.Table,
    metric: str,
    device: str,
    bounds: NDArray[np.int64],
    intervals: NDArray[np.int64],
) -> list[float] | None:
    """The counter's increase inside `intervals`, per step, ms."""
    ts, values = _series(samples, metric, device)
    if len(ts) < 2:
        return None
    out = np.zeros(len(bounds))
    if len(intervals):
        # Each interval clipped to each step it overlaps (a handful of intervals per step).
        step_of_start = np.searchsorted(bounds[:, 1], intervals[:, 0], side="right")
        step_of_end = np.searchsorted(bounds[:, 0], intervals[:, 1], side="left") - 1
        for k in range(len(bounds)):
            hit = (step_of_start <= k) & (step_of_end >= k)
            if not hit.any():
                continue
            a = np.maximum(intervals[hit, 0], bounds[k, 0])
            b = np.minimum(intervals[hit, 1], bounds[k, 1])
            keep = b > a
            out[k] = float(np.sum(np.interp(b[keep], ts, values) - np.interp(a[keep], ts, values)))
    return [round(float(v), 4) for v in np.maximum(out, 0.0) / 1e6]


def host_usage(
    samples: pa.Table,
    meta: WorkerMeta,
    events: pa.Table | None = None,
    counters: Mapping[str, list[float]] | None = None,
) -> HostUsage | None:
    """The worker's CPU use per step; None without its training thread's CPU time and wait.
    `events`: the window's events, to split the training thread's run-queue wait.
    `counters`: what the hook read at each step boundary (collector/window_reader.py
    `step_counters_ms`): where present, they replace the sampled values of the same counters,
    exact per step however late the sampler ran."""
    bounds = np.asarray(meta.window.step_bounds_ns, dtype=np.int64).reshape(-1, 2)
    if samples.num_rows == 0 or not len(bounds):
        return None
    counters = {k: v for k, v in (counters or {}).items() if len(v) == len(bounds)}
    device = f"rank{meta.rank}"
    main_run = counters.get("thread_cpu_ns") or _per_step_ms(samples, "cpu_run_ns", device, bounds)
    main_wait = counters.get("thread_wait_ns") or _per_step_ms(
        samples, "cpu_runqueue_wait_ns", device, bounds
    )
    if main_run is None or main_wait is None:
        return None
    exact = "thread_cpu_ns" in counters and "thread_wait_ns" in counters
    span = (int(bounds[0, 0]), int(bounds[-1, 1]))
    threads = _gauge(samples, "process_threads", device, span)
    quota = _gauge(samples, "cgroup_cpu_quota_cores", device, (0, span[1]))
    runnable = _gauge(samples, "procs_running", "host", span)
    in_communication = (
        _within_per_step(
            samples, "cpu_runqueue_wait_ns", device, bounds, _communication_intervals(events)
        )
        if events is not None and events.num_rows
        else None
    )
    if in_communication is not None:
        # Sampled, so smeared across the samples' gaps: never more than the step's wait.
        in_communication = [min(a, b) for a, b in zip(in_communication, main_wait, strict=True)]
    stamps, _ = _series(samples, "cpu_run_ns", device)
    stamps = stamps[(stamps >= span[0]) & (stamps <= span[1])]
    gap = float(np.percentile(np.diff(stamps), 95)) / 1e6 if len(stamps) > 2 else None
    return HostUsage(
        main_run_ms=main_run,
        exact_steps=exact,
        sample_gap_p95_ms=round(gap, 3) if gap is not None else None,
        main_wait_ms=main_wait,
        main_wait_communication_ms=in_communication,
        process_cpu_ms=counters.get("process_cpu_ns")
        or _per_step_ms(samples, "process_cpu_run_ns", device, bounds),
        process_wait_ms=_per_step_ms(samples, "process_runqueue_wait_ns", device, bounds),
        torch_threads_cpu_ms=_per_step_ms(samples, "torch_threads_cpu_run_ns", device, bounds),
        children_cpu_ms=_per_step_ms(samples, "children_cpu_run_ns", device, bounds),
        children_wait_ms=_per_step_ms(samples, "children_runqueue_wait_ns", device, bounds),
        threads=int(threads.max()) if len(threads) else None,
        throttled_ms=_per_step_ms(samples, "cgroup_throttled_ns", device, bounds),
        cpu_quota_cores=float(quota[-1]) if len(quota) else None,
        # procs_running counts the sampler's own thread: one less is the job and the rest.
        host_runnable=round(float(runnable.mean()) - 1.0, 2) if len(runnable) else None,
        host_cores=len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
    )
