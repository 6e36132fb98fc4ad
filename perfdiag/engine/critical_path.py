"""Per-worker critical path by priority sweep (docs/design.md §4).

Every instant of the window is charged to exactly one event, or to idle:
1. per thread or GPU stream ("lane"), the innermost running event (self time), except that an
   *enclosing* span (data loading, GC, communication) keeps the time of what runs inside it;
2. across lanes, the event of the highest charge class (perfdiag.api.taxonomy), GPU compute first;
   among equals, the one that started last.
Containers (ProfilerStep#N and the like) are never charged; instants where nothing is charged
are idle.

Both stages are one primitive, `max_cover`: for a set of intervals over elementary segments,
the highest-keyed interval covering each segment. It is computed without a per-event Python
loop: every interval writes its key to the two power-of-two blocks that exactly cover it (as a
sparse table does), then the blocks are pushed down level by level with numpy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from perfdiag.api import taxonomy

IntArray = npt.NDArray[np.int64]
IDLE = -1


@dataclass(frozen=True)
class ChargedTime:
    """The critical path of one window: time charged per (event, step).

    `event` holds row numbers of the events table, IDLE (-1) for time nothing was charged;
    `step` the window step; `ns` the charged nanoseconds. One entry per (event, step) pair."""

    event: IntArray
    step: IntArray
    ns: IntArray
    step_ns: IntArray  # duration of each window step

    @property
    def window_ns(self) -> int:
        return int(self.step_ns.sum())

    def per_event(self, n_events: int) -> IntArray:
        """Charged ns of each event row (idle excluded)."""
        charged = self.event >= 0
        return np.bincount(
            self.event[charged], weights=self.ns[charged], minlength=n_events
        ).astype(np.int64)

    def idle_per_step(self) -> IntArray:
        idle = self.event == IDLE
        return np.bincount(
            self.step[idle], weights=self.ns[idle], minlength=len(self.step_ns)
        ).astype(np.int64)


def max_cover(left: IntArray, right: IntArray, key: IntArray, n_segments: int) -> IntArray:
    """For segments 0..n_segments-1, the largest `key` among intervals [left, right) covering
    each segment, -1 where none does. Keys must be ≥ 0."""
    out = np.full(n_segments, -1, dtype=np.int64)
    length = right - left
    keep = length > 0
    if not keep.any() or n_segments == 0:
        return out
    left, right, key, length = left[keep], right[keep], key[keep], length[keep]
    level = np.frexp(length.astype(np.float64))[1].astype(np.int64) - 1  # floor(log2(length))
    by_level = np.argsort(level, kind="stable")
    level_sorted = level[by_level]
    top = int(level_sorted[-1])
    cuts = np.searchsorted(level_sorted, np.arange(top + 2))
    spare = np.empty_like(out)
    for k in range(top, -1, -1):
        chosen = by_level[cuts[k] : cuts[k + 1]]
        if len(chosen):
            width = 1 << k
            where = np.concatenate([left[chosen], right[chosen] - width])
            np.maximum.at(out, where, np.concatenate([key[chosen], key[chosen]]))
        if k:
            half = 1 << (k - 1)
            # Block [i, i + 2h) splits into [i, i + h) and [i + h, i + 2h).
            spare[:half] = out[:half]
            np.maximum(out[half:], out[:-half], out=spare[half:])
            out, spare = spare, out
    return out


def _rank(*keys: npt.NDArray[Any]) -> tuple[IntArray, IntArray]:
    """(rank of each row, rows by rank) in the lexicographic order of `keys` (last key most
    significant); each is the other's inverse permutation."""
    order = np.lexsort(keys)
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order), dtype=np.int64)
    return rank, order.astype(np.int64, copy=False)


def _cover_owner(
    starts: IntArray, ends: IntArray, key: IntArray, cuts: IntArray | None = None
) -> tuple[IntArray, IntArray]:
    """Elementary segments of the intervals (plus `cuts`) and the highest key covering each."""
    edges, where = _distinct_sorted(
        np.concatenate([starts, ends] + ([cuts] if cuts is not None else []))
    )
    n = len(starts)
    owner = max_cover(where[:n], where[n : 2 * n], key, max(len(edges) - 1, 0))
    return edges, owner


def critical_path(events: pa.Table, bounds: list[tuple[int, int]]) -> ChargedTime:
    """Charge every instant of the window steps `bounds` ([start, end) ns on the trace clock)
    to one event of `events` (EVENTS_SCHEMA) or to idle."""
    step_start = np.array([b[0] for b in bounds], dtype=np.int64)
    step_end = np.array([b[1] for b in bounds], dtype=np.int64)
    w0, w1 = int(step_start[0]), int(step_end[-1])

    ts = _ints(events["ts_ns"])
    end = ts + _ints(events["dur_ns"])
    container = taxonomy.is_container(events["kineto_cat"], events["name"])
    candidate = (~container) & (end > w0) & (ts < w1) & (end > ts)
    rows = np.flatnonzero(candidate)
    # Unclipped times: the keys use them, so that clipping at the window edge cannot tie a
    # child with its parent.
    start_o, end_o = ts[rows], end[rows]
    del ts, end, container, candidate
    start_c = np.maximum(start_o, w0)
    end_c = np.minimum(end_o, w1)
    keep = end_c > start_c
    rows, start_o, end_o, start_c, end_c = (a[keep] for a in (rows, start_o, end_o, start_c, end_c))

    category = events["category"].take(pa.array(rows))
    on_device = _ints(pc.is_valid(events["device"]).take(pa.array(rows))).astype(bool)
    lane = _lanes(
        on_device, _ints(events["pid"], fill=-1)[rows], _ints(events["tid"], fill=-1)[rows]
    )
    enclosing = taxonomy.is_enclosing(category)
    charge_class = taxonomy.charge_class(category, on_device)
    seg_event, seg_start, seg_end = _innermost_per_lane(
        lane, start_o, end_o, start_c, end_c, enclosing, w0, w1
    )

    # Stage 2: across lanes, the highest charge class, then the latest start.
    cross_key, by_cross = _rank(start_o, charge_class)
    cuts = np.concatenate([step_start, step_end])
    edges2, owner2 = _cover_owner(seg_start, seg_end, cross_key[seg_event], cuts)
    lengths = np.diff(edges2)
    mids = edges2[:-1]
    step = np.searchsorted(step_start, mids, side="right") - 1
    in_step = (step >= 0) & (mids < step_end[np.clip(step, 0, len(bounds) - 1)]) & (lengths > 0)
    event = np.full(len(owner2), IDLE, dtype=np.int64)
    charged = owner2 >= 0
    event[charged] = rows[by_cross[owner2[charged]]]
    return _aggregate(event[in_step], step[in_step], lengths[in_step], step_end - step_start)


def _innermost_per_lane(
    lane: IntArray,
    start_o: IntArray,
    end_o: IntArray,
    start_c: IntArray,
    end_c: IntArray,
    enclosing: npt.NDArray[np.bool_],
    w0: int,
    w1: int,
) -> tuple[IntArray, IntArray, IntArray]:
    """Stage 1: per lane, the innermost event (latest start, then shortest) wins, enclosing
    spans first. Runs of (candidate index, start, end); its temporaries go when it returns."""
    # Lanes are laid end to end on one axis so a single sweep handles them all.
    span = w1 - w0 + 1
    shift = lane * span - w0
    inner_key, by_key = _rank(-(end_o - start_o), start_o, enclosing.astype(np.int8))
    edges, owner = _cover_owner(start_c + shift, end_c + shift, inner_key)
    seg_rows = np.flatnonzero(owner >= 0)
    seg_event = by_key[owner[seg_rows]]
    seg_lane = lane[seg_event]
    seg_start = edges[seg_rows] - seg_lane * span + w0
    seg_end = edges[seg_rows + 1] - seg_lane * span + w0
    return _merge_runs(seg_event, seg_start, seg_end)


def _distinct_sorted(values: IntArray) -> tuple[IntArray, IntArray]:
    """(the distinct values in order, the index of each value among them): np.unique with
    return_inverse, by one sort (numpy's own is much slower on large int arrays)."""
    order = np.argsort(values, kind="stable")  # timsort: trace times come nearly in order
    ordered = values[order]
    new = np.empty(len(ordered), dtype=bool)
    new[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=new[1:])
    where = np.empty(len(values), dtype=np.int64)
    where[order] = np.cumsum(new) - 1
    return ordered[new], where


def _ints(column: pa.ChunkedArray | pa.Array, fill: int = 0) -> IntArray:
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if array.null_count:
        array = pc.fill_null(array, fill)
    return np.asarray(array.to_numpy(zero_copy_only=False)).astype(np.int64, copy=False)


def _lanes(on_device: npt.NDArray[np.bool_], pid: IntArray, tid: IntArray) -> IntArray:
    """A dense lane number per (host or device, pid, tid)."""
    if not len(pid):
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort((tid, pid, on_device))
    d, p, t = on_device[order], pid[order], tid[order]
    new = np.r_[True, (d[1:] != d[:-1]) | (p[1:] != p[:-1]) | (t[1:] != t[:-1])]
    lane = np.empty(len(pid), dtype=np.int64)
    lane[order] = np.cumsum(new) - 1
    return lane


def _merge_runs(
    event: IntArray, start: IntArray, end: IntArray
) -> tuple[IntArray, IntArray, IntArray]:
    """Join consecutive segments of the same event that touch."""
    if not len(event):
        return event, start, end
    new = np.r_[True, (event[1:] != event[:-1]) | (start[1:] != end[:-1])]
    heads = np.flatnonzero(new)
    tails = np.r_[heads[1:], len(event)] - 1
    return event[heads], start[heads], end[tails]


def _aggregate(event: IntArray, step: IntArray, ns: IntArray, step_ns: IntArray) -> ChargedTime:
    steps = len(step_ns)
    pair = (event + 1) * steps + step
    order = np.argsort(pair, kind="stable")
    pair = pair[order]
    heads = np.flatnonzero(np.r_[True, pair[1:] != pair[:-1]]) if len(pair) else np.zeros(0, int)
    total = np.add.reduceat(ns[order], heads) if len(heads) else np.zeros(0, dtype=np.int64)
    unique = pair[heads]
    return ChargedTime(
        event=unique // steps - 1,
        step=unique % steps,
        ns=total.astype(np.int64),
        step_ns=step_ns.astype(np.int64),
    )
