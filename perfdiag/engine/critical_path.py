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
    length = right - left
    keep = length > 0
    if n_segments == 0 or not keep.any():
        return np.full(n_segments, -1, dtype=np.int64)
    if not keep.all():
        left, right, key, length = left[keep], right[keep], key[keep], length[keep]
    # 32-bit where it fits: the level-by-level push-down reads and writes every segment once
    # per level, at half the memory traffic.
    small = n_segments < 2**31 and int(key.max()) < 2**31
    dtype = np.int32 if small else np.int64
    out = np.full(n_segments, -1, dtype=dtype)
    # floor(log2(length)): the exponent field of the (exact) float64; uint8 for numpy's radix
    # sort, which is linear.
    level = ((length.astype(np.float64).view(np.int64) >> 52) - 1023).astype(np.uint8)
    by_level = np.argsort(level, kind="stable")
    level_sorted = level[by_level]
    top = int(level_sorted[-1])
    cuts = np.searchsorted(level_sorted, np.arange(top + 2))
    # The intervals in level order, each array gathered once: a level is a slice of them.
    left, right, key = left[by_level], right[by_level], key[by_level].astype(dtype, copy=False)
    spare = np.empty_like(out)
    for k in range(top, -1, -1):
        first, last = int(cuts[k]), int(cuts[k + 1])
        if last > first:
            chosen = key[first:last]
            np.maximum.at(out, left[first:last], chosen)
            np.maximum.at(out, right[first:last] - (1 << k), chosen)
        if k:
            half = 1 << (k - 1)
            # Block [i, i + 2h) splits into [i, i + h) and [i + h, i + 2h).
            spare[:half] = out[:half]
            np.maximum(out[half:], out[:-half], out=spare[half:])
            out, spare = spare, out
    return out.astype(np.int64, copy=False)


def _ranks_of(order: npt.NDArray[Any]) -> tuple[IntArray, IntArray]:
    """(rank of each row, rows by rank) of an order of the rows; each is the other's inverse
    permutation."""
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order), dtype=np.int64)
    return rank, order.astype(np.int64, copy=False)


def _rank_by_start(
    start: IntArray,
    minor: IntArray | None,
    major: npt.NDArray[np.int8],
    by_start: IntArray | None = None,
) -> tuple[IntArray, IntArray]:
    """Ranks in the lexicographic order of (`major`, `start`, `minor`), ties in row order: what
    np.lexsort((minor, start, major)) gives, for `start` nearly in order and `major` of a few
    small values: one stable sort of the starts (a timsort of what is nearly sorted: ~8×
    faster than lexsort's sort of a random `minor`), `minor` ordered within runs of equal
    starts only, then a stable sort by `major` (a radix sort: int8). `by_start`: that stable
    argsort of `start`, when the caller has it already."""
    order = np.argsort(start, kind="stable") if by_start is None else by_start.copy()
    if minor is not None and len(order) > 1:
        ordered = start[order]
        tie = ordered[1:] == ordered[:-1]
        if tie.any():
            in_run = np.zeros(len(order), dtype=bool)
            in_run[1:] = tie
            in_run[:-1] |= tie
            at = np.flatnonzero(in_run)
            run = np.cumsum(np.r_[True, ~tie])[at]  # runs stay where they are
            tied = order[at]
            order[at] = tied[np.lexsort((minor[tied], run))]
    if len(order) and int(major.min()) != int(major.max()):
        order = order[np.argsort(major[order], kind="stable")]
    return _ranks_of(order)


def _cover_owner(starts: IntArray, ends: IntArray, key: IntArray) -> tuple[IntArray, IntArray]:
    """Elementary segments of the intervals and the highest key covering each."""
    edges, where = _distinct_sorted(np.concatenate([starts, ends]))
    n = len(starts)
    owner = max_cover(where[:n], where[n:], key, max(len(edges) - 1, 0))
    return edges, owner


def critical_path(events: pa.Table, bounds: list[tuple[int, int]]) -> ChargedTime:
    """Charge every instant of the window steps `bounds` ([start, end) ns on the trace clock)
    to one event of `events` (EVENTS_SCHEMA) or to idle."""
    step_start = np.array([b[0] for b in bounds], dtype=np.int64)
    step_end = np.array([b[1] for b in bounds], dtype=np.int64)
    w0, w1 = int(step_start[0]), int(step_end[-1])
    # Each stage is a function, and what a stage no longer needs is dropped: the peak memory
    # is a few arrays of the candidates, not all of them at once.
    rows, start_o, end_o = _candidates(events, w0, w1)
    lane, enclosing, charge_class = _lanes_and_classes(events, rows)
    by_start = np.argsort(start_o, kind="stable")  # both stages' orders start from it
    cuts = np.concatenate([step_start, step_end])
    edges, run_event, run_first, run_end = _innermost_per_lane(
        lane, start_o, end_o, enclosing, by_start, cuts, w0, w1
    )
    del lane, enclosing, end_o

    # Stage 2: across lanes, the highest charge class, then the latest start.
    cross_key, by_cross = _rank_by_start(start_o, None, charge_class, by_start)
    del start_o, charge_class, by_start
    run_key = cross_key[run_event]
    del cross_key, run_event
    owner = max_cover(run_first, run_end, run_key, max(len(edges) - 1, 0))
    del run_first, run_end, run_key
    return _charged(edges, owner, rows[by_cross], step_start, step_end)


def _candidates(events: pa.Table, w0: int, w1: int) -> tuple[IntArray, IntArray, IntArray]:
    """(rows, start, end) of the events that can be charged: not containers, and running in
    the window. Unclipped times: the keys use them, so that clipping at the window edge cannot
    tie a child with its parent."""
    ts = _ints(events["ts_ns"])
    end = ts + _ints(events["dur_ns"])
    container = taxonomy.is_container(events["kineto_cat"], events["name"])
    # Lasting and running in the window [w0, w1): clipped to it, each keeps some time
    # (min(end, w1) > max(ts, w0) follows, for w0 < w1; an empty window has no candidates).
    running = (~container) & (end > w0) & (ts < w1) & (end > ts) & (w0 < w1)
    rows = np.flatnonzero(running)
    return rows, ts[rows], end[rows]


def _lanes_and_classes(
    events: pa.Table, rows: IntArray
) -> tuple[IntArray, npt.NDArray[np.bool_], npt.NDArray[np.int8]]:
    """The lane, whether enclosing, and the charge class of each candidate row."""
    # The category column's distinct values, its rows taken: no second dictionary encoding.
    categories = taxonomy.distinct(events["category"])
    category = taxonomy.Distinct(categories.values, categories.codes[rows])
    on_device = np.asarray(
        pc.is_valid(events["device"]).to_numpy(zero_copy_only=False), dtype=bool
    )[rows]
    lane = _lanes(
        on_device, _ints(events["pid"], fill=-1)[rows], _ints(events["tid"], fill=-1)[rows]
    )
    return lane, taxonomy.is_enclosing(category), taxonomy.charge_class(category, on_device)


def _charged(
    edges: IntArray,
    owner: IntArray,
    event_by_key: IntArray,
    step_start: IntArray,
    step_end: IntArray,
) -> ChargedTime:
    """The elementary segments and their owners (keys, -1 idle) → charged time per (event,
    step) of the segments inside the steps."""
    lengths = np.diff(edges)
    mids = edges[:-1]
    step = _step_of(mids, step_start)
    inside = np.clip(step, 0, len(step_start) - 1)
    in_step = (step >= 0) & (mids < step_end[inside]) & (lengths > 0)
    # One gather: key k is entry k + 1, idle (-1) entry 0.
    event = np.concatenate([[IDLE], event_by_key])[owner + 1]
    if not in_step.all():
        event, step, lengths = event[in_step], step[in_step], lengths[in_step]
    return _aggregate(event, step, lengths, step_end - step_start)


def _step_of(mids: IntArray, step_start: IntArray) -> IntArray:
    """np.searchsorted(step_start, mids, side="right") - 1 (the last step starting at or
    before each of the sorted `mids`, -1 before the first): where the steps start in order,
    by finding the few steps' places among the mids, each step's segments being a run."""
    if len(step_start) > 1 and bool((step_start[1:] < step_start[:-1]).any()):
        return np.searchsorted(step_start, mids, side="right") - 1
    places = np.searchsorted(mids, step_start, side="left")
    labels = np.arange(-1, len(step_start), dtype=np.int64)
    return np.repeat(labels, np.diff(places, prepend=0, append=len(mids)))


def _innermost_per_lane(
    lane: IntArray,
    start_o: IntArray,
    end_o: IntArray,
    enclosing: npt.NDArray[np.bool_],
    by_start: IntArray,
    cuts: IntArray,
    w0: int,
    w1: int,
) -> tuple[IntArray, IntArray, IntArray, IntArray]:
    """Stage 1: per lane, the innermost event (latest start, then shortest) wins, enclosing
    spans first. Returns the edges stage 2 sweeps over (every lane's edges and the `cuts`, on
    the trace clock) and the runs of one event on one lane: the candidate index, the first
    segment and the one past the last, on those edges. Its temporaries go when it returns."""
    # Lanes are laid end to end on one axis so a single sweep handles them all.
    span = w1 - w0 + 1
    shift = lane * span - w0
    # Minor key, minus the duration: of two events starting together, the shorter ranks higher.
    inner_key, by_key = _rank_by_start(
        start_o, start_o - end_o, enclosing.astype(np.int8), by_start
    )
    lane_edges, owner = _cover_owner(
        np.maximum(start_o, w0) + shift, np.minimum(end_o, w1) + shift, inner_key
    )
    del inner_key, shift
    # Every run's ends are lane edges: their distinct times, with the cuts, are stage 2's
    # edges, found by one sort of the lane edges (already in order lane by lane).
    edges, where = _distinct_sorted(np.concatenate([_unshifted(lane_edges, span, w0), cuts]))
    del lane_edges
    seg_rows = np.flatnonzero(owner >= 0)
    seg_event = by_key[owner[seg_rows]]
    heads, tails = _runs(seg_event, seg_rows)
    return edges, seg_event[heads], where[seg_rows[heads]], where[seg_rows[tails] + 1]


def _unshifted(lane_edges: IntArray, span: int, w0: int) -> IntArray:
    """The trace-clock times of edges laid lane after lane, lane k's from k * span (time w0
    there): `lane_edges % span + w0`, for edges in order, by subtracting each lane's shift
    from its run of edges (no division of every edge)."""
    if not len(lane_edges):
        return lane_edges
    lanes = int(lane_edges[-1]) // span + 1
    firsts = np.searchsorted(lane_edges, np.arange(1, lanes, dtype=np.int64) * span)
    counts = np.diff(firsts, prepend=0, append=len(lane_edges))
    times: IntArray = lane_edges - np.repeat(np.arange(lanes, dtype=np.int64) * span - w0, counts)
    return times


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
    """A dense lane number per (host or device, pid, tid), in that order."""
    if not len(pid):
        return np.zeros(0, dtype=np.int64)
    first_pid, first_tid = int(pid.min()), int(tid.min())
    pids, tids = int(pid.max()) - first_pid + 1, int(tid.max()) - first_tid + 1
    if 2 * pids * tids <= 4 * len(pid) + (1 << 20):
        # The three as one number in the same order, its few values found in place: no sort.
        key = (on_device * pids + (pid - first_pid)) * tids + (tid - first_tid)
        present = np.zeros(2 * pids * tids, dtype=bool)
        present[key] = True
        lanes: IntArray = np.searchsorted(np.flatnonzero(present), key)
        return lanes
    order = np.lexsort((tid, pid, on_device))
    d, p, t = on_device[order], pid[order], tid[order]
    new = np.r_[True, (d[1:] != d[:-1]) | (p[1:] != p[:-1]) | (t[1:] != t[:-1])]
    lane = np.empty(len(pid), dtype=np.int64)
    lane[order] = np.cumsum(new) - 1
    return lane


def _runs(event: IntArray, segment: IntArray) -> tuple[IntArray, IntArray]:
    """Heads and tails of the runs of one event over consecutive segments (`segment` in
    order): where the event changes or a segment is skipped (time the event does not own)."""
    if not len(event):
        return event, event
    new = np.empty(len(event), dtype=bool)
    new[0] = True
    new[1:] = (event[1:] != event[:-1]) | (segment[1:] != segment[:-1] + 1)
    heads = np.flatnonzero(new)
    tails = np.empty_like(heads)
    tails[:-1] = heads[1:] - 1
    tails[-1] = len(event) - 1
    return heads, tails


def _aggregate(event: IntArray, step: IntArray, ns: IntArray, step_ns: IntArray) -> ChargedTime:
    steps = len(step_ns)
    pair = (event + 1) * steps + step
    exact = int(step_ns.sum()) < 2**53  # float sums of whole ns are exact below (104 days)
    if len(pair) and exact and int(pair.max()) < 8 * len(pair) + (1 << 20):
        unique, total = _sums_by_counting(pair, ns)
    else:
        unique, total = _sums_by_sorting(pair, ns)
    event_1, step = np.divmod(unique, steps)
    return ChargedTime(
        event=event_1 - 1,
        step=step,
        ns=total.astype(np.int64),
        step_ns=step_ns.astype(np.int64),
    )


def _sums_by_counting(keys: IntArray, values: IntArray) -> tuple[IntArray, npt.NDArray[Any]]:
    """(the distinct keys in order, the sum of the values of each): in place over the range of
    the keys, no sort. Float sums: exact while they stay below 2**53."""
    present = np.zeros(int(keys.max()) + 1, dtype=bool)
    present[keys] = True
    unique = np.flatnonzero(present)
    slot = np.zeros(len(present), dtype=np.int32)
    slot[unique] = np.arange(len(unique), dtype=np.int32)
    return unique, np.bincount(slot[keys], weights=values, minlength=len(unique))


def _sums_by_sorting(keys: IntArray, values: IntArray) -> tuple[IntArray, npt.NDArray[Any]]:
    """_sums_by_counting by one sort, for keys spread too widely to count in place."""
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    heads = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]]) if len(keys) else np.zeros(0, int)
    total = np.add.reduceat(values[order], heads) if len(heads) else np.zeros(0, dtype=np.int64)
    return keys[heads], total
