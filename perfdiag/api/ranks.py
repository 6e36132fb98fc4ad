"""Sets of ranks as runs of consecutive ranks.

A job can expect up to 1,000,000 ranks (perfdiag/api/limits.py) while a capture holds a few of them:
verdict.json stores the ranks it expected but found no file of as runs (`Verdict.missing`), and
the terminal and the report print rank lists as runs ("0-3,7"), so that what is written follows
the number of runs, never the number of ranks.
"""

from __future__ import annotations

from collections.abc import Iterable

MAX_RANK_RUNS = 12
"""Runs a printed rank list shows; the others are cut, with the count of ranks."""

Run = tuple[int, int]
"""First and last rank (inclusive) of consecutive ranks."""


def rank_runs(ranks: Iterable[int]) -> list[Run]:
    """[7, 0, 1, 2, 3] → [(0, 3), (7, 7)]."""
    runs: list[Run] = []
    for rank in sorted(set(ranks)):
        if runs and rank == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], rank)
        else:
            runs.append((rank, rank))
    return runs


def merge_runs(runs: Iterable[Run]) -> list[Run]:
    """Runs in any order, overlapping or adjacent → ascending, disjoint, non-adjacent runs."""
    merged: list[Run] = []
    for first, last in sorted(runs):
        if merged and first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    return merged


def run_count(runs: Iterable[Run]) -> int:
    """How many ranks disjoint runs hold."""
    return sum(last - first + 1 for first, last in runs)


def format_runs(runs: list[Run], max_runs: int = MAX_RANK_RUNS) -> str:
    """[(0, 3), (7, 7)] → '0-3,7'; beyond `max_runs` runs, cut with the count of ranks
    ('0,2,4,… (50000 ranks)'). `runs` are ascending and disjoint (rank_runs, merge_runs)."""
    shown = [_run(first, last) for first, last in runs[:max_runs]]
    if len(runs) > max_runs:
        return ",".join(shown) + f",… ({run_count(runs)} ranks)"
    return ",".join(shown)


def runs_phrase(runs: list[Run], capital: bool = False) -> str:
    """'rank 4' or 'ranks 0-3,7' ('Rank'/'Ranks' with `capital`)."""
    word = "Rank" if capital else "rank"
    if len(runs) == 1 and runs[0][0] == runs[0][1]:
        return f"{word} {runs[0][0]}"
    return f"{word}s {format_runs(runs)}"


def _run(first: int, last: int) -> str:
    if last == first:
        return str(first)
    if last == first + 1:
        return f"{first},{last}"
    return f"{first}-{last}"
