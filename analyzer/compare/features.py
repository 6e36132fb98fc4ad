"""The concatenated summary table as dense rank × feature matrices (numpy).

A feature is a (function, category) row of the summaries, a category total, or the time a rank
spends outside communication ("non-wait" time: the quantity that separates a culprit from the
peers waiting for it). Values are mean milliseconds per step. Only features that can matter
are kept dense: functions whose β reaches the materiality floor on some rank, plus the top
functions for the report — so the matrices stay small even for 1,000,000 ranks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from perfdiag.analyzer.load.worker_table import WorkerMetas
from perfdiag.api.schema import IDLE, IDLE_FUNCTION, OTHER_FUNCTION, WorkerMeta
from perfdiag.api.taxonomy import COLLECTIVE_WAIT_PREFIXES, COMMUNICATION

WAIT = "<waiting>"
"""Pseudo category of the feature 'time in communication or waiting for it'."""
NON_WAIT = "<non-wait>"
"""Pseudo category of the feature 'all other time' (idle included: uninstrumented work)."""

LEVEL_FUNCTION = 0
LEVEL_CATEGORY = 1
LEVEL_WAIT = 2
LEVEL_NON_WAIT = 3


_SEP = "\x1f"
TOP_FUNCTIONS = 25
INCLUSIVE_FUNCTIONS = 16
"""Functions kept by their inclusive time (`Features.inclusive_ms`), the largest first."""


@dataclass(frozen=True)
class StepTimes:
    ranks: NDArray[np.int64]
    """Sorted global ranks with a summary."""
    durations_ms: NDArray[np.float64]
    """(R, S) duration of each analysed step; NaN past a rank's last step."""

    @cached_property
    def median_ms(self) -> NDArray[np.float64]:
        return np.asarray(np.nanmedian(self.durations_ms, axis=1), dtype=np.float64)

    @cached_property
    def mean_ms(self) -> NDArray[np.float64]:
        return np.asarray(np.nanmean(self.durations_ms, axis=1), dtype=np.float64)

    @cached_property
    def counts(self) -> NDArray[np.int64]:
        return np.asarray(np.sum(~np.isnan(self.durations_ms), axis=1), dtype=np.int64)

    @classmethod
    def from_metas(cls, metas: Mapping[int, WorkerMeta]) -> StepTimes:
        columns = WorkerMetas.of(metas)
        return cls(ranks=columns.ranks.copy(), durations_ms=columns.step_durations_ms())


@dataclass(frozen=True)
class Features:
    ranks: NDArray[np.int64]
    steps: StepTimes
    functions: list[str | None]
    """Function name per feature (None for category totals and the non-wait total)."""
    categories: list[str]
    level: NDArray[np.int8]
    waiting: NDArray[np.bool_]
    """Features that are time spent in or waiting for communication."""
    ms: NDArray[np.float64]
    """(R, K) mean ms per step of each feature on each rank (0 where absent)."""
    non_wait_wall_ms: NDArray[np.float64] | None = None
    """(R,) the non-wait feature before the run-queue wait was taken out (wall time: what the
    peers of a rank that waits in communication are doing meanwhile)."""
    cpu_wait: NDArray[np.float64] | None = None
    """(R, S) ms each step the training thread waited for a CPU (run queue), when every rank
    has host samples: taken out of the non-wait feature, which is then the rank's own time
    (working or blocked), never time the scheduler withheld from it."""
    calls: NDArray[np.float64] | None = None
    """(R, K) mean calls per step of each function feature (0 for the totals): whether a rank
    makes calls its peers do not, or makes the same calls and they take longer."""
    inclusive_ms: NDArray[np.float32] | None = None
    """(R, J) inclusive ms per step of the functions outside communication whose inclusive
    time reaches the threshold somewhere (at most INCLUSIVE_FUNCTIONS): a function that one
    rank calls more often shows here even when its time is charged to what it runs (a
    dataset's `__getitem__`, its work in the ops it calls, under a caller called as often)."""
    inclusive_calls: NDArray[np.float32] | None = None
    """(R, J) mean calls per step of those functions."""

    @property
    def wait_index(self) -> int:
        return int(np.flatnonzero(self.level == LEVEL_WAIT)[0])

    @property
    def non_wait_index(self) -> int:
        return int(np.flatnonzero(self.level == LEVEL_NON_WAIT)[0])

    @property
    def mean_step_ms(self) -> NDArray[np.float64]:
        return self.steps.mean_ms

    @cached_property
    def beta(self) -> NDArray[np.float64]:
        """(R, K) window β: time over window time, i.e. ms per step over mean step ms."""
        step = self.mean_step_ms[:, None]
        return np.divide(self.ms, step, out=np.zeros_like(self.ms), where=step > 0)

    def index_of(self, category: str, function: str | None = None) -> int | None:
        for k, (fn, cat) in enumerate(zip(self.functions, self.categories, strict=True)):
            if cat == category and fn == function:
                return k
        return None

    def label(self, k: int) -> str:
        fn = self.functions[k]
        return f"{fn} ({self.categories[k]})" if fn is not None else self.categories[k]


def _row_keys(summary: pa.Table) -> tuple[NDArray[np.int64], list[str]]:
    joined = pc.binary_join_element_wise(
        summary.column("category"), summary.column("function"), _SEP
    )
    encoded = pc.dictionary_encode(joined).combine_chunks()
    codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    return codes, encoded.dictionary.to_pylist()


def build_features(
    summary: pa.Table,
    steps: StepTimes,
    *,
    min_beta: float,
    top: int = TOP_FUNCTIONS,
    cpu_wait: NDArray[np.float64] | None = None,
) -> Features:
    """Dense matrices for the functions that reach `min_beta` somewhere, plus the `top` ones.
    `cpu_wait` (R, S): run-queue wait per step, taken out of the non-wait feature."""
    ranks = steps.ranks
    n_ranks = len(ranks)
    rank_col = summary.column("rank").to_numpy().astype(np.int64)
    pos = np.searchsorted(ranks, rank_col)
    time_ms = summary.column("time_ms").to_numpy(zero_copy_only=False).astype(np.float64)
    n_steps = np.maximum(steps.counts, 1)
    row_ms = np.nan_to_num(time_ms) / n_steps[pos]
    mean_step = steps.mean_ms
    row_beta = np.divide(
        row_ms, mean_step[pos], out=np.zeros_like(row_ms), where=mean_step[pos] > 0
    )

    codes, keys = _row_keys(summary)
    max_beta = np.zeros(len(keys))
    np.maximum.at(max_beta, codes, row_beta)
    order = np.argsort(-max_beta, kind="stable")
    keep = max_beta >= min_beta
    keep[order[:top]] = True
    kept = np.flatnonzero(keep)
    kept = kept[np.argsort(-max_beta[kept], kind="stable")]
    column_of = np.full(len(keys), -1, dtype=np.int64)
    column_of[kept] = np.arange(len(kept))

    cat_codes, cat_names = _categories(summary)
    n_fun, n_cat = len(kept), len(cat_names)
    ms = np.zeros((n_ranks, n_fun + n_cat + 2))
    rows = column_of[codes] >= 0
    np.add.at(ms, (pos[rows], column_of[codes[rows]]), row_ms[rows])
    calls = np.zeros_like(ms)
    row_calls = np.nan_to_num(
        summary.column("count").to_numpy(zero_copy_only=False).astype(np.float64)
    )
    np.add.at(calls, (pos[rows], column_of[codes[rows]]), row_calls[rows] / n_steps[pos[rows]])
    waiting_row = waiting_rows(summary)
    # Category totals hold the work of the category: a Python frame that waits on a
    # collective counts as waiting (the <waiting> feature), not as Python work.
    is_comm_category = np.array([c == COMMUNICATION for c in cat_names], dtype=bool)
    in_category = ~waiting_row | is_comm_category[cat_codes]
    np.add.at(ms, (pos[in_category], n_fun + cat_codes[in_category]), row_ms[in_category])
    np.add.at(ms[:, -2], pos[waiting_row], row_ms[waiting_row])
    np.add.at(ms[:, -1], pos[~waiting_row], row_ms[~waiting_row])
    wall = ms[:, -1].copy()
    row_steps = n_steps[pos]
    inclusive_ms, inclusive_calls = _inclusive(
        summary, codes, pos, n_ranks, row_steps, row_calls / row_steps, mean_step[pos],
        ~waiting_row, min_beta,
    )  # fmt: skip
    if cpu_wait is not None:
        ms[:, -1] = np.maximum(ms[:, -1] - np.nanmean(cpu_wait, axis=1), 0.0)

    functions: list[str | None] = []
    categories: list[str] = []
    for code in kept.tolist():
        category, function = keys[code].split(_SEP, 1)
        functions.append(function)
        categories.append(category)
    waiting = [
        cat == COMMUNICATION or is_collective_wait(fn)
        for fn, cat in zip(functions, categories, strict=True)
    ]
    waiting += [c == COMMUNICATION for c in cat_names] + [True, False]
    functions += [None] * (n_cat + 2)
    categories += [*cat_names, WAIT, NON_WAIT]
    level = np.array(
        [LEVEL_FUNCTION] * n_fun + [LEVEL_CATEGORY] * n_cat + [LEVEL_WAIT, LEVEL_NON_WAIT],
        dtype=np.int8,
    )
    return Features(
        ranks=ranks,
        steps=steps,
        functions=functions,
        categories=categories,
        level=level,
        waiting=np.array(waiting, dtype=bool),
        ms=ms,
        non_wait_wall_ms=wall,
        cpu_wait=cpu_wait,
        calls=calls,
        inclusive_ms=inclusive_ms,
        inclusive_calls=inclusive_calls,
    )


def _inclusive(
    summary: pa.Table,
    codes: NDArray[np.int64],
    pos: NDArray[np.int64],
    n_ranks: int,
    row_steps: NDArray[np.int64],
    calls: NDArray[np.float64],
    row_step_ms: NDArray[np.float64],
    eligible: NDArray[np.bool_],
    min_beta: float,
) -> tuple[NDArray[np.float32], NDArray[np.float32]]:
    """(R, J) inclusive ms and calls per step of the named functions among `eligible` rows
    (not `<idle>`, `<other>` or a built-in) that ranks call unequally often and whose
    inclusive time reaches `min_beta` of the rank's mean step somewhere, the
    INCLUSIVE_FUNCTIONS largest. Per row: `row_steps` its rank's steps, `calls` its calls per
    step, `row_step_ms` its rank's mean step."""
    if "wall_ms" not in summary.column_names:  # a table made for a test of other columns
        empty = np.zeros((n_ranks, 0), dtype=np.float32)
        return empty, empty.copy()
    wall = summary.column("wall_ms").to_numpy(zero_copy_only=False).astype(np.float64)
    wall_ms = np.nan_to_num(wall) / row_steps
    named = ~np.asarray(
        pc.starts_with(summary.column("function"), "<").to_numpy(zero_copy_only=False),
        dtype=bool,
    )
    beta = np.divide(wall_ms, row_step_ms, out=np.zeros_like(wall_ms), where=row_step_ms > 0)
    beta[~(eligible & named)] = 0.0
    n_keys = int(codes.max()) + 1 if len(codes) else 0
    best = np.zeros(n_keys)
    np.maximum.at(best, codes, beta)
    # Only functions some rank calls more often than another: the outer frames (the step,
    # the training loop) hold the most inclusive time and are called alike everywhere.
    most, least = np.zeros(n_keys), np.full(n_keys, np.inf)
    np.maximum.at(most, codes, calls)
    np.minimum.at(least, codes, calls)
    best[~(most > least * 1.05)] = 0.0
    chosen = np.argsort(-best, kind="stable")[:INCLUSIVE_FUNCTIONS]
    chosen = chosen[best[chosen] >= min_beta]
    column = np.full(len(best), -1, dtype=np.int64)
    column[chosen] = np.arange(len(chosen))
    rows = (column[codes] >= 0) & eligible & named
    at = (pos[rows], column[codes[rows]])
    ms = np.zeros((n_ranks, len(chosen)), dtype=np.float32)
    made = np.zeros_like(ms)
    np.add.at(ms, at, wall_ms[rows].astype(np.float32))
    np.add.at(made, at, calls[rows].astype(np.float32))
    return ms, made


def is_collective_wait(function: str | None) -> bool:
    return function is not None and function.startswith(COLLECTIVE_WAIT_PREFIXES)


AUTOGRAD_ENTRY = (
    r"^(<built-in method run_backward of |torch/autograd/graph\.py\(\d+\): _engine_run_backward$)"
)
"""The training thread's call into the autograd engine. For CUDA tensors the backward pass runs
on the engine's device threads (pt_autograd_N), whose events are the rank's backward work; the
calling thread waits inside this call, so its self time there is no Python overhead."""


def autograd_entry_rows(rows: pa.Table) -> NDArray[np.bool_]:
    """Rows of the summary that are the training thread's call into the autograd engine."""
    mask = pc.fill_null(pc.match_substring_regex(rows.column("function"), AUTOGRAD_ENTRY), False)
    return np.asarray(mask.to_numpy(zero_copy_only=False), dtype=bool)


def waiting_rows(summary: pa.Table) -> NDArray[np.bool_]:
    """Rows of the summary that are communication or a blocking wait on it."""
    comm = pc.equal(summary.column("category"), COMMUNICATION)
    wait = pc.starts_with(summary.column("function"), COLLECTIVE_WAIT_PREFIXES[0])
    for prefix in COLLECTIVE_WAIT_PREFIXES[1:]:
        wait = pc.or_(wait, pc.starts_with(summary.column("function"), prefix))
    mask = pc.fill_null(pc.or_(comm, wait), False)
    return np.asarray(mask.to_numpy(zero_copy_only=False), dtype=bool)


def _categories(summary: pa.Table) -> tuple[NDArray[np.int64], list[str]]:
    encoded = pc.dictionary_encode(summary.column("category")).combine_chunks()
    codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    return codes, encoded.dictionary.to_pylist()


def per_step_ms(
    summary: pa.Table, features: Features, positions: NDArray[np.int64]
) -> NDArray[np.float64]:
    """(len(positions), K, S) ms of every feature in every step, for a few ranks only.

    Per-step values are needed only to judge the persistence of candidate outliers, so this
    reads the rows of those ranks alone.
    """
    ranks = features.ranks[positions]
    subset = summary.filter(pc.is_in(summary.column("rank"), pa.array(ranks, pa.int32())))
    durations = features.steps.durations_ms[positions]
    n_steps = durations.shape[1]
    out = np.zeros((len(positions), len(features.functions), n_steps))
    if subset.num_rows == 0:
        return out
    sub_pos = np.searchsorted(ranks, subset.column("rank").to_numpy().astype(np.int64))
    per_step = padded_lists(subset.column("beta_per_step").combine_chunks(), n_steps)
    values = per_step * np.nan_to_num(durations)[sub_pos]

    lookup = {
        (cat, fn): k
        for k, (fn, cat) in enumerate(zip(features.functions, features.categories, strict=True))
    }
    fn_col = subset.column("function").to_pylist()
    cat_col = subset.column("category").to_pylist()
    # One dictionary lookup per row of a handful of ranks (not per event).
    fn_index = np.array([lookup.get((c, f), -1) for c, f in zip(cat_col, fn_col, strict=True)])
    cat_index = np.array([lookup.get((c, None), -1) for c in cat_col])
    has_fn = fn_index >= 0
    np.add.at(out, (sub_pos[has_fn], fn_index[has_fn]), values[has_fn])
    waiting = waiting_rows(subset)
    is_comm = np.array([c == COMMUNICATION for c in cat_col], dtype=bool)
    has_cat = (cat_index >= 0) & (~waiting | is_comm)
    np.add.at(out, (sub_pos[has_cat], cat_index[has_cat]), values[has_cat])
    np.add.at(out[:, features.wait_index, :], sub_pos[waiting], values[waiting])
    np.add.at(out[:, features.non_wait_index, :], sub_pos[~waiting], values[~waiting])
    if features.cpu_wait is not None:
        nw = features.non_wait_index
        wait = np.nan_to_num(features.cpu_wait[positions][:, :n_steps])
        out[:, nw, : wait.shape[1]] = np.maximum(out[:, nw, : wait.shape[1]] - wait, 0.0)
    out[np.isnan(np.broadcast_to(durations[:, None, :], out.shape))] = np.nan
    return out


def padded_lists(lists: pa.ListArray, width: int) -> NDArray[np.float64]:
    """A list<float> column as an (n, width) matrix, zero-padded (missing steps count 0)."""
    n = len(lists)
    out = np.zeros((n, width))
    lengths = pc.fill_null(pc.list_value_length(lists), 0).to_numpy().astype(np.int64)
    flat = pc.list_flatten(lists).to_numpy(zero_copy_only=False).astype(np.float64)
    if flat.size == 0:
        return out
    row = np.repeat(np.arange(n), lengths)
    starts = np.cumsum(lengths) - lengths
    col = np.arange(flat.size) - np.repeat(starts, lengths)
    fits = col < width
    out[row[fits], col[fits]] = np.nan_to_num(flat[fits])
    return out


def is_named_function(function: str | None) -> bool:
    """A real function name (not the folded '<other>' row nor '<idle>')."""
    return function is not None and function not in (OTHER_FUNCTION, IDLE_FUNCTION)


FINDING_CATEGORY = {"annotation": "python", "other": "cpu_op"}
"""Taxonomy categories a finding names by what they hold: time inside a user's annotation that
no op covers is Python between ops; other host work is op work."""


def finding_category(category: str) -> str:
    return FINDING_CATEGORY.get(category, category)


def is_idle(category: str) -> bool:
    return category == IDLE
