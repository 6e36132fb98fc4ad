"""perfdiag's own activity in a trace: the hook's Python frames and everything inside them.

With Python stacks on, torch.profiler records the hook like any other Python code: at every
step boundary of the window the optimizer post hook closes and opens `ProfilerStep#n` and reads
the thread's CPU counters (`perfdiag/collector/hook/window.py(141): _mark` holding
`<built-in function thread_time_ns>`), and the hook's daemon thread polls the plan and writes
heartbeats (`perfdiag/collector/hook/__init__.py(346): _run` holding `threading.py`,
`pathlib.py`, lock acquires…). None of that is the training's: it is dropped on import.

- A frame of the hook is a `python_function` event named `…perfdiag/collector/hook/<file>.py(<line>):
  <function>` (torch.profiler writes the file relative to the `sys.path` entry it was found
  under, so the hook folder on PYTHONPATH gives `perfdiag/collector/hook/…`), or the explicit
  step call `perfdiag/collector/__init__.py(<line>): step`.
- Every host event of the same thread lying within one of those frames goes with it.
- A thread that runs nothing else (its other frames only enclose the hook's: `threading.py`'s
  bootstrap around the hook's thread function) is the hook's thread: all of it goes.
- The hook's work leaves one event (`OWN_TIME_NAME`, Kineto category `OWN_TIME_CAT`) per span,
  which holds its time so that it is not charged to someone else's frame: on a thread that does
  the training's work too, each outermost hook frame (else the frame around it, torch's
  optimizer wrapper, would get its time); on the hook's thread, each hook frame directly under
  its thread function (polling the plan, writing a heartbeat: the GIL it holds meanwhile stops
  the training's Python), not its waits. The summary counts that time as idle (docs/engine.md,
  "perfdiag's own time").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from perfdiag.api import taxonomy

HOOK_FRAME = r"^(?:[^()]*/)?perfdiag/collector/(?:hook/[^/()]+|__init__)\.py\(\d+\): "
"""The name of a Python frame of perfdiag's hook (or of `perfdiag.collector.step()`)."""
OWN_TIME_CAT = "perfdiag"
"""Kineto category of the events that hold the hook's time on a training thread."""
OWN_TIME_NAME = "<perfdiag>"

BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class OwnEvents:
    """perfdiag's own activity in a RAW_SCHEMA table."""

    drop: BoolArray  # rows to leave out: the hook's frames, what lies within them, its threads
    holders: IntArray  # rows (ascending) whose copies, renamed OWN_TIME_NAME, hold its time


def own_events(events: pa.Table) -> OwnEvents:
    """What the events table leaves out of `events` (a RAW_SCHEMA table) and which rows'
    copies stand for it: one per outermost hook frame of a training thread, one per hook frame
    directly under the hook thread's function."""
    hook = _hook_frames(events)
    n = events.num_rows
    drop = np.zeros(n, dtype=bool)
    if not hook.any():
        return OwnEvents(drop, np.zeros(0, dtype=np.int64))
    pid = _ints(events["pid"])
    tid = _ints(events["tid"])
    host = ~taxonomy.is_device(events["cat"]) & (pid >= 0) & (tid >= 0)
    start = _ints(events["ts_ns"])
    end = start + _ints(events["dur_ns"])
    holders: list[IntArray] = []
    for p, t in _lanes_with(pid[hook], tid[hook]):
        rows = np.flatnonzero(host & (pid == p) & (tid == t))
        lane = _lane_parts(start[rows], end[rows], hook[rows])
        if lane.others_run:
            drop[rows[lane.inside]] = True
            holders.append(rows[lane.outermost])
        else:  # the hook's own thread
            drop[rows] = True
            holders.append(rows[lane.second_level])
    keep_time = np.concatenate(holders) if holders else np.zeros(0, dtype=np.int64)
    return OwnEvents(drop, np.sort(keep_time))


class _LaneParts:
    """What the hook holds of one thread's events (indices into that thread's rows)."""

    def __init__(
        self, inside: BoolArray, outermost: IntArray, second_level: IntArray, others_run: bool
    ) -> None:
        self.inside = inside  # hook frames and what lies within one
        self.outermost = outermost  # hook frames within no other hook frame
        self.second_level = second_level  # hook frames within only the outermost ones
        self.others_run = others_run  # anything neither inside nor around a hook frame


def _lane_parts(start: IntArray, end: IntArray, hook: BoolArray) -> _LaneParts:
    """Nesting by time, vectorized: a row lies inside a hook frame when some hook frame that
    starts at or before it ends at or after it (the running maximum of the hook frames' ends,
    in order of start), and lies around one when some hook frame that starts at or after it
    ends at or before it (the minimum of the later ones' ends)."""
    h_start, h_end = start[hook], end[hook]
    order = np.lexsort((-h_end, h_start))  # by start; the longer first (the enclosing one)
    h_start, h_end = h_start[order], h_end[order]
    reach = np.maximum.accumulate(h_end)
    before = np.searchsorted(h_start, start, side="right") - 1
    inside = (before >= 0) & (reach[np.maximum(before, 0)] >= end)
    later_min_end = np.minimum.accumulate(h_end[::-1])[::-1]
    after = np.searchsorted(h_start, start, side="left")
    around = (after < len(h_start)) & (later_min_end[np.minimum(after, len(h_start) - 1)] <= end)
    nested = _nested(h_end)
    inner = np.flatnonzero(nested)
    second = inner[~_nested(h_end[inner])]
    where = np.flatnonzero(hook)[order]
    return _LaneParts(inside, where[~nested], where[second], bool((~inside & ~around).any()))


def _nested(ends: IntArray) -> BoolArray:
    """Of frames in order of start (the longer first on a tie), those within an earlier one:
    an earlier frame reaches their end."""
    if not len(ends):
        return np.zeros(0, dtype=bool)
    reach = np.maximum.accumulate(ends)
    result: BoolArray = np.r_[np.iinfo(np.int64).min, reach[:-1]] >= ends
    return result


def _hook_frames(events: pa.Table) -> BoolArray:
    cats = taxonomy.distinct(events["cat"])
    names = taxonomy.distinct(events["name"])
    python = cats.mask(
        np.array([str(c).lower() == "python_function" for c in cats.values.to_pylist()], bool)
    )
    matches = pc.match_substring_regex(names.values, HOOK_FRAME)
    named = names.mask(np.asarray(matches.to_numpy(zero_copy_only=False), dtype=bool))
    result: BoolArray = python & named
    return result


def _lanes_with(pid: IntArray, tid: IntArray) -> list[tuple[int, int]]:
    """The distinct (pid, tid) of the hook's frames: a few threads, whatever the trace size."""
    pairs = np.unique(np.stack([pid, tid], axis=1), axis=0)
    return [(int(p), int(t)) for p, t in pairs if p >= 0 and t >= 0]


def _ints(column: pa.ChunkedArray | pa.Array) -> IntArray:
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if array.null_count:
        array = pc.fill_null(array, -1)
    return np.asarray(array.to_numpy(zero_copy_only=False)).astype(np.int64, copy=False)
