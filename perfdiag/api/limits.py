"""Upper bounds on what one analysis accepts from its input (docs/limits.md).

A trace or a worker's file states its own rank and the job's world size; a claim above these
bounds is refused for that file (with the reason), so that no work or memory is spent per rank
that the input does not hold.
"""

from __future__ import annotations

MAX_RANKS = 1_000_000
"""Ranks are 0 … MAX_RANKS − 1; a world size or --expected-ranks is at most MAX_RANKS."""

MAX_STEP = 2**62
"""ProfilerStep#N numbers above this are refused (step arithmetic stays inside int64)."""


def rank_problem(rank: int) -> str | None:
    """Why `rank` cannot be a rank of a job perfdiag analyses, or None when it can."""
    if rank < 0:
        return f"rank {rank} is negative"
    if rank >= MAX_RANKS:
        return f"rank {rank} is above the limit of {MAX_RANKS:,} ranks (docs/limits.md)"
    return None


def world_size_problem(world_size: int) -> str | None:
    """Why `world_size` cannot be the size of a job perfdiag analyses, or None when it can."""
    if world_size < 1:
        return f"world size {world_size} is not positive"
    if world_size > MAX_RANKS:
        return f"world size {world_size} is above the limit of {MAX_RANKS:,} ranks (docs/limits.md)"
    return None


MAX_TRACE_BYTES = 4 << 30
"""The JSON text of one trace file (gunzipped) holds at most this many bytes."""

MAX_STRING_BYTES = 16 << 20
"""One JSON string of a trace holds at most this many bytes between its quotes."""


def size_text(size: int) -> str:
    """A limit in bytes as docs/limits.md writes it ("4 GiB", "16 MiB")."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"{size:,} bytes"
