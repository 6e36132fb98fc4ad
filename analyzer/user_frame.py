"""The user's own function behind a culprit's top contributor, from the rank's raw events.

The largest contributor of a slow rank is often not code the user wrote: a builtin
(`<built-in function sleep>`), a torch internal (`torch/utils/data/_utils/fetch.py(54):
<listcomp>`, which holds a slow `Dataset.__getitem__`), an aten op. The frame to name is the
user's: the innermost frame of the user's code *inside* the contributor that holds most of
its time (the slow `__getitem__` → its `decode_record`), else the innermost user frame that
*encloses* it (the `flush_metrics()` that calls `sleep`). Frames are Python function events of
the same thread, nested by time. Only the culprits' ranks are read (events.parquet).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from functools import lru_cache

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

EventsReader = Callable[[int], "pa.Table | None"]
FRAME = re.compile(r"^(?P<path>[^()<][^()]*)\((?P<line>\d+)\): (?P<name>.+)$")
LIBRARY_ROOTS = frozenset({"torch", "perfdiag", "typing_extensions", "numpy", "threading"})
MAX_EVENTS = 4000
"""Executions of the contributor examined (the longest); nesting is a matrix over them."""
HOLDS = 0.5
"""A frame inside the contributor is named when its executions hold this share of it."""


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
