"""Per-category expected ranges (docs/design.md §4): job-wide problems no peer comparison can see.

When all (or most) ranks spend more of the window in a category than a well-running job does
(Python overhead on a GPU job, a starving input pipeline, communication-bound scaling), every
peer looks alike and only an absolute bound reveals it. Communication time that a named slow
worker explains (its victims' waiting) is discounted first. Like a slow worker, a rank is over
a bound only when it is over in most steps (`min_persistence`): one long pause (a full GC right
after the profiler started, a checkpoint) is not the job's shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from perfdiag.analyzer.compare.features import (
    Features,
    autograd_entry_rows,
    is_named_function,
    padded_lists,
    waiting_rows,
)
from perfdiag.analyzer.compare.outliers import MIN_STEPS_FOR_PERSISTENCE
from perfdiag.analyzer.compare.peers import PeerGroups
from perfdiag.analyzer.findings.fusion import Fusion
from perfdiag.api.taxonomy import COMMUNICATION
from perfdiag.api.thresholds import ExpectedRanges, Thresholds

TOP_FUNCTIONS = 5
PYTHON = "python"


@dataclass(frozen=True)
class RangeViolation:
    category: str
    bound: float
    job_kind: str
    ranks: list[int]
    total_ranks: int
    median_beta: float
    severity: float
    discounted_beta: float
    """β removed first because a slow worker explains it (victims' waiting)."""
    top_functions: list[tuple[str, float]]
    """(function, mean β across ranks), largest first."""


def ranges_for(features: Features, has_gpu: bool, thresholds: Thresholds) -> ExpectedRanges:
    return thresholds.expected_ranges_gpu if has_gpu else thresholds.expected_ranges_cpu


def check_expected_ranges(
    summary: pa.Table,
    features: Features,
    groups: PeerGroups,
    fusion: Fusion,
    thresholds: Thresholds,
    *,
    has_gpu: bool,
) -> list[RangeViolation]:
    n_ranks = len(features.ranks)
    if n_ranks == 0:
        return []
    bounds = ranges_for(features, has_gpu, thresholds).bounds()
    discount = np.zeros(n_ranks)
    for worker in fusion.slow:
        if worker.victims is None:
            continue
        victims = np.isin(features.ranks, worker.victims.ranks)
        discount[victims] = np.maximum(discount[victims], worker.severity)

    violations = []
    for category, bound in bounds.items():
        k = features.index_of(category)
        if k is None:
            continue
        beta = features.beta[:, k]
        if category == PYTHON:
            beta = np.maximum(beta - _autograd_entry_beta(summary, features), 0.0)
        if category == COMMUNICATION:
            beta = np.maximum(beta - discount, 0.0)
        over = beta > bound
        if over.sum() < thresholds.expected_range_rank_fraction * n_ranks:
            continue
        over &= _persistently_over(summary, features, category, bound, discount, thresholds)
        if over.sum() < thresholds.expected_range_rank_fraction * n_ranks:
            continue
        severity = float(np.clip(np.median(np.maximum(beta - bound, 0.0)), 0.0, 1.0))
        violations.append(
            RangeViolation(
                category=category,
                bound=bound,
                job_kind="gpu" if has_gpu else "cpu",
                ranks=[int(r) for r in features.ranks[over]],
                total_ranks=n_ranks,
                median_beta=float(np.median(beta)),
                severity=severity,
                discounted_beta=float(np.median(discount)) if category == COMMUNICATION else 0.0,
                top_functions=_top_functions(summary, category, n_ranks),
            )
        )
    return violations


def _persistently_over(
    summary: pa.Table,
    features: Features,
    category: str,
    bound: float,
    discount: NDArray[np.float64],
    thresholds: Thresholds,
) -> NDArray[np.bool_]:
    """Ranks whose per-step β of `category` exceeds `bound` in at least `min_persistence` of
    their steps (True where too few steps to judge). Rows counted as the category feature
    counts them: waiting frames belong to communication only."""
    durations = features.steps.durations_ms
    n_ranks, n_steps = durations.shape
    rows = _range_rows(summary, category)
    per_step = np.zeros((n_ranks, n_steps))
    if rows.num_rows:
        rank_of_row = rows.column("rank").to_numpy().astype(np.int64)
        position = np.clip(np.searchsorted(features.ranks, rank_of_row), 0, n_ranks - 1)
        known = features.ranks[position] == rank_of_row
        values = padded_lists(rows.column("beta_per_step").combine_chunks(), n_steps)
        np.add.at(per_step, position[known], values[known])
    valid = ~np.isnan(durations)
    shows = valid & (per_step - discount[:, None] > bound)
    n_valid = valid.sum(axis=1)
    judged = n_valid >= MIN_STEPS_FOR_PERSISTENCE
    return np.asarray(
        ~judged | (shows.sum(axis=1) >= thresholds.min_persistence * n_valid), dtype=np.bool_
    )


def _range_rows(summary: pa.Table, category: str) -> pa.Table:
    """The summary rows a bound on `category` counts: waiting frames belong to communication
    only, and the training thread's wait inside the autograd engine to no Python overhead."""
    rows = summary.filter(pc.equal(summary.column("category"), category))
    if category != COMMUNICATION and rows.num_rows:
        rows = rows.filter(pa.array(~waiting_rows(rows)))
    if category == PYTHON and rows.num_rows:
        rows = rows.filter(pa.array(~autograd_entry_rows(rows)))
    return rows


def _autograd_entry_beta(summary: pa.Table, features: Features) -> NDArray[np.float64]:
    """Each rank's β inside the autograd engine's entry frames (0 where none)."""
    rows = summary.filter(pc.equal(summary.column("category"), PYTHON))
    rows = rows.filter(pa.array(autograd_entry_rows(rows))) if rows.num_rows else rows
    out = np.zeros(len(features.ranks))
    if rows.num_rows:
        rank_of_row = rows.column("rank").to_numpy().astype(np.int64)
        position = np.clip(np.searchsorted(features.ranks, rank_of_row), 0, len(out) - 1)
        known = features.ranks[position] == rank_of_row
        np.add.at(out, position[known], rows.column("beta").fill_null(0).to_numpy()[known])
    return out


def _top_functions(summary: pa.Table, category: str, n_ranks: int) -> list[tuple[str, float]]:
    rows = _range_rows(summary, category)
    if rows.num_rows == 0:
        return []
    # Sums per function with numpy, not Arrow's group_by, whose first call imports
    # pyarrow.acero and pyarrow.dataset (~30 ms of a fresh `perfdiag analyze`).
    functions = pc.dictionary_encode(
        rows.column("function").combine_chunks(), null_encoding="encode"
    )
    names = functions.dictionary.to_pylist()
    totals = np.bincount(
        functions.indices.to_numpy(),
        weights=rows.column("beta").fill_null(0).to_numpy(),
        minlength=len(names),
    )
    order = np.argsort(-totals)
    out = []
    for j in order.tolist():
        if is_named_function(names[j]):
            out.append((str(names[j]), float(totals[j] / n_ranks)))
        if len(out) == TOP_FUNCTIONS:
            break
    return out
