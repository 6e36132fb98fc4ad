"""GPU time breakdown of one rank, with the definitions of HTA's temporal breakdown.

Holistic Trace Analysis (`hta/analyzers/breakdown_analysis.py`, `get_temporal_breakdown`)
splits a rank's GPU span — first GPU activity's start to the last one's end — into idle time
(no GPU activity), compute time (a compute kernel runs) and the rest ("non-compute"). The
non-compute part is split further here, by the docs/design.md §4 priority (GPU compute > GPU memory >
communication): memcpy/memset time, then NCCL kernel time, then what is left (CUDA
synchronization records Kineto draws on the GPU). Which GPU activity counts is HTA's too:
kernels, memcpy/memset and cuda_sync records; with two steps or more, only the activity
launched (by correlation id) from a host event that started before the last step, since the
trace may stop before the last step's GPU work is recorded in full.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from perfdiag.api import taxonomy
from perfdiag.api.breakdown import RankBreakdown

# What HTA reads as GPU activity: the events Kineto writes with a CUDA stream.
GPU_ACTIVITY = pa.array(["kernel", "gpu_memcpy", "gpu_memset", "cuda_sync"])

Ints = npt.NDArray[np.int64]


def gpu_breakdown(events: pa.Table, bounds: list[tuple[int, int]]) -> RankBreakdown:
    """The breakdown of one rank's events table (perfdiag.api.schema EVENTS_SCHEMA) whose window
    is `bounds` (the step ranges)."""
    # Per distinct Kineto category (an answer the summary of the same table shares).
    cats = taxonomy.distinct(events["kineto_cat"])
    per_value = pc.is_in(cats.values, value_set=GPU_ACTIVITY).to_numpy(zero_copy_only=False)
    gpu = pa.array(cats.mask(np.asarray(per_value, dtype=bool)))
    if len(bounds) >= 2:
        gpu = pc.and_(gpu, _launched_before(events, gpu, bounds[-1][0]))
    # The four columns read, not the whole table (its names).
    activity = events.select(["ts_ns", "dur_ns", "category", "kineto_cat"]).filter(gpu)
    if activity.num_rows == 0:
        return RankBreakdown(
            span_s=0.0,
            gpu_compute=None,
            communication=None,
            gpu_memory=None,
            gpu_other=None,
            idle=None,
        )
    start: Ints = np.asarray(activity["ts_ns"].to_numpy(), dtype=np.int64)
    end: Ints = start + np.asarray(activity["dur_ns"].to_numpy(), dtype=np.int64)
    category = activity["category"]
    compute = _mask(pc.equal(category, "gpu_compute"))
    memory = compute | _mask(pc.equal(category, "gpu_memory"))
    # NCCL kernels only: a CUDA sync record is never communication, whatever its name.
    nccl = memory | _mask(
        pc.and_(pc.equal(category, "communication"), pc.equal(activity["kineto_cat"], "kernel"))
    )
    busy = [
        covered_ns(start[mask], end[mask])
        for mask in (compute, memory, nccl, np.ones(len(start), dtype=bool))
    ]
    span = int(end.max() - start.min())
    if span <= 0:
        return RankBreakdown(
            span_s=0.0, gpu_compute=0.0, communication=0.0, gpu_memory=0.0, gpu_other=0.0, idle=1.0
        )
    return RankBreakdown(
        span_s=span / 1e9,
        gpu_compute=busy[0] / span,
        gpu_memory=(busy[1] - busy[0]) / span,
        communication=(busy[2] - busy[1]) / span,
        gpu_other=(busy[3] - busy[2]) / span,
        idle=(span - busy[3]) / span,
    )


def covered_ns(start: Ints, end: Ints) -> int:
    """Length of the union of the intervals [start, end)."""
    if not len(start):
        return 0
    order = np.argsort(start, kind="stable")
    start, end = start[order], end[order]
    reach = np.maximum.accumulate(end)
    # A new merged interval begins where an interval starts after everything before it ended.
    first = np.flatnonzero(np.r_[True, start[1:] > reach[:-1]])
    last_end = np.maximum.reduceat(end, first)
    return int((last_end - start[first]).sum())


def _launched_before(events: pa.Table, gpu: pa.ChunkedArray | pa.Array, cutoff: int) -> pa.Array:
    """GPU events whose correlation id is that of a host event starting before `cutoff`."""
    host = pc.and_(
        pc.and_(pc.invert(gpu), pc.is_valid(events["correlation"])),
        pc.less(events["ts_ns"], cutoff),
    )
    launches = pc.unique(events["correlation"].filter(host))
    return pc.fill_null(pc.is_in(events["correlation"], value_set=launches), False)


def _mask(values: pa.ChunkedArray | pa.Array) -> npt.NDArray[np.bool_]:
    return np.asarray(pc.fill_null(values, False).to_numpy(zero_copy_only=False), dtype=bool)
