"""The user's own function behind a culprit's excess, from the raw events of the culprit and
of a typical peer (events.parquet; only those ranks are read).

The largest contributor of a slow rank is often not code the user wrote: a builtin
(`<built-in function sleep>`), a torch internal (`torch/utils/data/_utils/fetch.py(54):
<listcomp>`, which holds a slow `Dataset.__getitem__`), an op (`aten::mm`). `excess_frames`
names the user frame that holds the excess: the innermost user frame (least inclusive time)
whose inclusive time per step exceeds the peer's by at least half of the rank's excess, short
of the training loop itself (`flush_metrics` around the `sleep`, `decode_record` inside the
`__getitem__`, `extra_compute` around the matrix products). When no frame does, `user_frame`
looks at the contributor alone: the user frame inside it that holds most of its time, else the
innermost user frame that calls it. The frames around the one named that hold the excess too
are said with it (`__getitem__ → decode_sample → tokenize`). Frames are Python function events,
nested by time.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from functools import lru_cache

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

EventsReader = Callable[[int], "pa.Table | None"]
FRAME = re.compile(r"^(?P<path>[^()<][^()]*)\((?P<line>\d+)\): (?P<name>.+)$")
LIBRARY_ROOTS = frozenset({"torch", "perfdiag", "typing_extensions", "numpy", "threading"})
MAX_EVENTS = 4000
"""Executions of the contributor examined (the longest); nesting is a matrix over them."""
HOLDS = 0.5
"""A frame inside the contributor is named when its executions hold this share of it."""
MAX_PATH = 4
"""Frames of the user's code said from the outermost holding the excess to the one named."""


@lru_cache(maxsize=1)
def _library_roots() -> frozenset[str]:
    roots = set(LIBRARY_ROOTS) | set(sys.stdlib_module_names)
    try:
        from importlib.metadata import packages_distributions

        roots |= set(packages_distributions())
    except Exception:  # a broken environment only makes the library list shorter
        pass
    return frozenset(roots)


def is_user_frame(name: str) -> bool:
    """A Python frame of the user's code: `file.py(12): fn`, not a builtin, the standard
    library or an installed package (torch's frames read `torch/…`)."""
    match = FRAME.match(name)
    if match is None:
        return False
    path = match.group("path").strip()
    if path.startswith("/"):  # an absolute path: the interpreter's own or a site-packages file
        return "site-packages" not in path and "/lib/python" not in path
    first = path.split("/", 1)[0]
    module = first[:-3] if first.endswith(".py") else first
    return module not in _library_roots()


def user_frame(events: pa.Table, function: str, *, enclosing: bool = True) -> str | None:
    """The user's frame for `function` on one rank (see the module doc), or None.
    `enclosing`: also the frame that calls it (a builtin's caller); for a library function that
    waits (a DataLoader's queue), the caller is only the training loop, which says nothing."""
    if events.num_rows == 0:
        return None
    host = pc.is_null(events.column("device"))
    names = events.column("name")
    target = events.filter(pc.and_(host, pc.equal(names, function)))
    if target.num_rows == 0:
        return None
    if target.num_rows > MAX_EVENTS:
        target = target.sort_by([("dur_ns", "descending")]).slice(0, MAX_EVENTS)
    encoded = pc.dictionary_encode(names).combine_chunks()
    distinct = encoded.dictionary.to_pylist()
    user_codes = np.flatnonzero([isinstance(n, str) and is_user_frame(n) for n in distinct])
    if not len(user_codes):
        return None
    codes = encoded.indices.to_numpy(zero_copy_only=False)
    is_user = np.isin(codes, user_codes) & host.to_numpy(zero_copy_only=False)
    frames = events.filter(pa.array(is_user))
    frame_codes = codes[is_user]
    f_tid = target.column("tid").to_numpy()
    f_start = target.column("ts_ns").to_numpy()
    f_end = f_start + target.column("dur_ns").to_numpy()
    u_tid = frames.column("tid").to_numpy()
    u_start = frames.column("ts_ns").to_numpy()
    u_end = u_start + frames.column("dur_ns").to_numpy()
    same = f_tid[:, None] == u_tid[None, :]
    inside = same & (u_start[None, :] >= f_start[:, None]) & (u_end[None, :] <= f_end[:, None])
    total = float(np.sum(f_end - f_start))
    if inside.any() and total > 0:
        held = np.zeros(len(distinct))
        np.add.at(held, frame_codes, (inside * (u_end - u_start)[None, :]).sum(axis=0))
        holding = np.flatnonzero(held >= HOLDS * total)
        if len(holding):  # the innermost of those holding most of it holds the least
            return str(distinct[int(holding[np.argmin(held[holding])])])
    around = same & (u_start[None, :] <= f_start[:, None]) & (u_end[None, :] >= f_end[:, None])
    if not enclosing or not around.any():
        return None
    # Innermost enclosing frame of each execution: the latest start among its ancestors.
    starts = np.where(around, u_start[None, :], np.iinfo(np.int64).min)
    innermost = np.argmax(starts, axis=1)[around.any(axis=1)]
    weights = (f_end - f_start)[around.any(axis=1)]
    votes = np.zeros(len(distinct))
    np.add.at(votes, frame_codes[innermost], weights)
    return str(distinct[int(np.argmax(votes))])


LOOP_SHARE = 0.8
"""A frame that spans more than this share of the step is the training loop, not a cause."""


def _inclusive_ms_per_step(events: pa.Table, steps: int) -> dict[str, float]:
    """Inclusive time of each user frame per analysed step, ms (window steps only)."""
    rows = events.filter(
        pc.and_(pc.is_null(events.column("device")), pc.greater_equal(events.column("step"), 0))
    )
    if rows.num_rows == 0:
        return {}
    encoded = pc.dictionary_encode(rows.column("name")).combine_chunks()
    distinct = encoded.dictionary.to_pylist()
    user = np.array([isinstance(n, str) and is_user_frame(n) for n in distinct], dtype=bool)
    codes = encoded.indices.to_numpy(zero_copy_only=False)
    keep = user[codes]
    total = np.zeros(len(distinct))
    np.add.at(total, codes[keep], rows.column("dur_ns").to_numpy()[keep] / 1e6)
    return {str(distinct[k]): float(total[k]) / max(steps, 1) for k in np.flatnonzero(total)}


def _anonymous(name: str) -> bool:
    """A comprehension, generator expression or lambda: part of the function around it."""
    match = FRAME.match(name)
    return match is not None and match.group("name").startswith("<")


def excess_frames(
    own: pa.Table,
    own_steps: int,
    peer: pa.Table,
    peer_steps: int,
    excess_ms: float,
    step_ms: float,
) -> tuple[str, ...]:
    """The user's frames that hold a rank's excess, outermost first, ending with the frame
    named: of the user frames whose inclusive time per step exceeds a typical peer's by at least
    HOLDS of the excess, short of the training loop itself, the one most its own (the least of
    its time matched by the peer: a function only this rank runs before a shared one it calls,
    or one every rank runs whose wall time a busy host stretched), the innermost of equals; before
    it, the holding frames around it (at least its inclusive time: its callers, e.g. a Dataset's
    `__getitem__` and the decoder it calls, so that a function shared by several paths is named
    with the one that is slow), at most MAX_PATH in all. Empty when no frame holds the
    excess."""
    if excess_ms <= 0:
        return ()
    mine = _inclusive_ms_per_step(own, own_steps)
    theirs = _inclusive_ms_per_step(peer, peer_steps)
    holding = [
        (round(theirs.get(name, 0.0) / ms, 1), ms, name)
        for name, ms in mine.items()
        if ms - theirs.get(name, 0.0) >= HOLDS * excess_ms
        and ms <= LOOP_SHARE * step_ms
        and not _anonymous(name)
    ]
    if not holding:
        return ()
    _, named_ms, named = min(holding)
    around = sorted(
        (ms, name)
        for _, ms, name in holding
        if name != named
        and ms >= named_ms
        # A caller runs around the frame, not (as a callee of equal timestamps) inside it.
        and _encloses(own, name, named)
        and not _encloses(own, named, name)
    )
    return (*[name for _, name in reversed(around[: MAX_PATH - 1])], named)


def _intervals(events: pa.Table, name: str) -> tuple[NDArray[np.int64], ...]:
    """(tid, start, end) of a host frame's executions, the longest MAX_EVENTS."""
    rows = events.filter(
        pc.and_(pc.is_null(events.column("device")), pc.equal(events.column("name"), name))
    )
    if rows.num_rows > MAX_EVENTS:
        rows = rows.sort_by([("dur_ns", "descending")]).slice(0, MAX_EVENTS)
    start = rows.column("ts_ns").to_numpy()
    return rows.column("tid").to_numpy(), start, start + rows.column("dur_ns").to_numpy()


def _encloses(events: pa.Table, outer: str, inner: str) -> bool:
    """Whether most of `inner`'s time runs inside executions of `outer` (its caller)."""
    o_tid, o_start, o_end = _intervals(events, outer)
    i_tid, i_start, i_end = _intervals(events, inner)
    total = float(np.sum(i_end - i_start))
    if total <= 0 or not len(o_tid):
        return False
    inside = (
        (i_tid[:, None] == o_tid[None, :])
        & (i_start[:, None] >= o_start[None, :])
        & (i_end[:, None] <= o_end[None, :])
    ).any(axis=1)
    return float(np.sum((i_end - i_start)[inside])) >= HOLDS * total
