"""The behavior pattern of one worker (docs/design.md §4): one row per (function, category).

β(f) is the share of the window's time the critical path charges to f; the rows with idle
("<idle>", category "idle": time nothing ran, and perfdiag's own time) sum to 1. Count and
duration statistics describe the executions that started inside the window. Functions that
matter little (β and wall share both under `beta_floor`) are folded into one "<other>" row per
category, and at most `max_rows` rows are kept, so a summary stays a few KB however many events
the window held.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from perfdiag.api import taxonomy
from perfdiag.api.schema import IDLE as IDLE_CATEGORY
from perfdiag.api.schema import (
    IDLE_FUNCTION,
    OTHER_FUNCTION,
    SUMMARY_SCHEMA,
    SUMMARY_SCHEMA_ID,
    WorkerMeta,
    with_meta,
)
from perfdiag.engine.allocator import system_allocator
from perfdiag.engine.critical_path import IDLE, critical_path
from perfdiag.engine.kineto.own_events import OWN_TIME_CAT

BETA_FLOOR = 1e-4
MAX_ROWS = 500

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


def summarize(
    events: pa.Table,
    meta: WorkerMeta,
    *,
    beta_floor: float = BETA_FLOOR,
    max_rows: int = MAX_ROWS,
) -> pa.Table:
    """SUMMARY_SCHEMA rows (with the worker metadata) for the events of one window."""
    with system_allocator(), taxonomy.same_columns():
        return _summarize(events, meta, beta_floor, max_rows)


def _summarize(events: pa.Table, meta: WorkerMeta, beta_floor: float, max_rows: int) -> pa.Table:
    bounds = meta.window.step_bounds_ns
    charged = critical_path(events, bounds)
    step_ns = charged.step_ns.astype(np.float64)
    window_ns = float(charged.window_ns)
    steps = len(bounds)

    functions = _function_names(events["name"])
    categories = events["category"]
    # Group 0 is idle; the others are the distinct (category, function) pairs.
    group_of_event, names, cats = _groups(functions, categories)
    own = _own_time(events)
    group_of_event[own] = 0  # perfdiag's own time: idle for the training
    n_groups = len(names)

    group = np.zeros(len(charged.event), dtype=np.int64)  # idle
    busy = charged.event != IDLE
    group[busy] = group_of_event[charged.event[busy]]
    # Summed in the order of the charged time, as np.add.at would (a bincount is much faster).
    per_group_step = np.bincount(
        group * steps + charged.step,
        weights=charged.ns.astype(np.float64),
        minlength=n_groups * steps,
    ).reshape(n_groups, steps)

    dur = _ints(events["dur_ns"])
    started = (_ints(events["step"]) >= 0) & ~own  # executions of the training's functions
    started_group, started_dur = group_of_event[started], dur[started]
    wall = np.bincount(started_group, weights=started_dur, minlength=n_groups)
    weight = np.maximum(per_group_step.sum(axis=1), wall) / window_ns
    folded = _fold(weight, cats, beta_floor, max_rows)
    # Remap to the kept groups plus one "<other>" per category.
    final_names, final_cats, remap = _apply_fold(names, cats, folded)
    n_final = len(final_names)
    final_step = np.zeros((n_final, steps), dtype=np.float64)
    np.add.at(final_step, remap, per_group_step)
    started_final = remap[started_group]

    count = np.bincount(started_final, minlength=n_final)
    final_wall = np.bincount(started_final, weights=started_dur, minlength=n_final)
    median, p95 = _quantiles(started_final, started_dur, n_final, (0.5, 0.95))

    time_ns = final_step.sum(axis=1)
    beta = time_ns / window_ns
    keep = (time_ns > 0) | (count > 0)
    keep[0] = True  # idle, always present so that β sums to 1
    order = np.flatnonzero(keep)
    order = order[np.lexsort((np.array(final_names, dtype=object)[order], -beta[order]))]
    with np.errstate(divide="ignore", invalid="ignore"):
        per_step = np.where(step_ns > 0, final_step / step_ns, 0.0)
    n_rows = len(order)
    table = pa.table(
        {
            "rank": pa.array(np.full(n_rows, meta.rank, dtype=np.int32)),
            "function": pa.array([final_names[i] for i in order], pa.string()),
            "category": pa.array([final_cats[i] for i in order], pa.string()),
            "beta": pa.array(beta[order]),
            "time_ms": pa.array(time_ns[order] / 1e6),
            "count": pa.array(count[order].astype(np.int64)),
            "wall_ms": pa.array(final_wall[order] / 1e6),
            "dur_median_us": pa.array(median[order] / 1e3, mask=count[order] == 0),
            "dur_p95_us": pa.array(p95[order] / 1e3, mask=count[order] == 0),
            # Filled by the agent from hardware.parquet when it has samples
            # (analyzer/hardware_samples.with_resources); unknown here.
            "resource": pa.nulls(n_rows, pa.string()),
            "resource_mu": pa.nulls(n_rows, pa.float64()),
            "resource_sigma": pa.nulls(n_rows, pa.float64()),
            "beta_per_step": _list_column(per_step[order].astype(np.float32), steps),
        },
        schema=SUMMARY_SCHEMA,
    )
    return table.replace_schema_metadata(
        with_meta(SUMMARY_SCHEMA, SUMMARY_SCHEMA_ID, meta).metadata
    )


def _own_time(events: pa.Table) -> npt.NDArray[np.bool_]:
    """The events that hold perfdiag's own time (its hook's work, where the import dropped
    its frames: perfdiag.engine.kineto.own_events)."""
    cats = taxonomy.distinct(events["kineto_cat"])
    return cats.mask(np.array([c == OWN_TIME_CAT for c in cats.values.to_pylist()], dtype=bool))


def _ints(column: pa.ChunkedArray | pa.Array) -> IntArray:
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return np.asarray(pc.fill_null(array, 0).to_numpy(zero_copy_only=False)).astype(np.int64)


def _function_names(name: pa.ChunkedArray | pa.Array) -> taxonomy.Distinct:
    """taxonomy.distinct(taxonomy.function_names(name)), computed on the distinct names: the
    names are in order of first appearance, so their functions are too, and no per-row string
    column is built and encoded again."""
    names = taxonomy.distinct(name)
    cleaned = taxonomy.function_names(
        taxonomy.Distinct(names.values, np.arange(len(names.values), dtype=np.int64))
    )
    functions = taxonomy.distinct(cleaned)
    return taxonomy.Distinct(functions.values, functions.codes[names.codes])


def _groups(
    functions: taxonomy.Distinct, categories: pa.ChunkedArray | pa.Array
) -> tuple[IntArray, list[str], list[str]]:
    """Group number of each event, and the (function, category) of each group; group 0 is
    idle."""
    fun_values, fun_idx = functions
    cat_values, cat_idx = taxonomy.distinct(categories)
    pair = fun_idx * max(len(cat_values), 1) + cat_idx
    if not len(pair):
        return np.zeros(0, dtype=np.int64), [IDLE_FUNCTION], [IDLE_CATEGORY]
    distinct_pairs, inverse = _distinct_inverse(pair, max(len(fun_values), 1) * len(cat_values))
    funs = fun_values.to_pylist()
    cats = cat_values.to_pylist()
    n_cat = max(len(cat_values), 1)
    names = [IDLE_FUNCTION] + [funs[int(p) // n_cat] for p in distinct_pairs]
    group_cats = [IDLE_CATEGORY] + [cats[int(p) % n_cat] for p in distinct_pairs]
    return inverse + 1, names, group_cats


def _distinct_inverse(values: IntArray, bound: int) -> tuple[IntArray, IntArray]:
    """(the distinct values in order, the index of each value among them), for values in
    [0, bound)."""
    if bound <= 4 * len(values) + (1 << 20):  # counted in place: linear, no sort
        present = np.bincount(values, minlength=bound) > 0
        position = np.cumsum(present) - 1
        return np.flatnonzero(present), position[values]
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    new = np.r_[True, ordered[1:] != ordered[:-1]]
    inverse = np.empty(len(values), dtype=np.int64)
    inverse[order] = np.cumsum(new) - 1
    return ordered[new], inverse


def _fold(
    weight: FloatArray, cats: list[str], floor: float, max_rows: int
) -> npt.NDArray[np.bool_]:
    """Groups to fold into their category's "<other>" row (never idle)."""
    folded = weight < floor
    kept = np.flatnonzero(~folded)
    n_categories = len(set(cats))
    budget = max(max_rows - n_categories - 1, 1)  # room for the "<other>" rows and idle
    if len(kept) > budget:
        by_weight = kept[np.argsort(-weight[kept], kind="stable")]
        folded[by_weight[budget:]] = True
    folded[0] = False
    return folded


def _apply_fold(
    names: list[str], cats: list[str], folded: npt.NDArray[np.bool_]
) -> tuple[list[str], list[str], IntArray]:
    final_names: list[str] = []
    final_cats: list[str] = []
    index: dict[tuple[str, str], int] = {}
    remap = np.empty(len(names), dtype=np.int64)
    for group, (name, cat) in enumerate(zip(names, cats, strict=True)):
        key = (OTHER_FUNCTION if folded[group] else name, cat)
        if key not in index:
            index[key] = len(final_names)
            final_names.append(key[0])
            final_cats.append(cat)
        remap[group] = index[key]
    return final_names, final_cats, remap


def _quantiles(
    group: IntArray, values: IntArray, n_groups: int, qs: tuple[float, ...]
) -> tuple[FloatArray, ...]:
    """Per-group quantiles (linear interpolation, as numpy.quantile), NaN for empty groups."""
    counts = np.bincount(group, minlength=n_groups)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    present = counts > 0
    places = []  # per quantile: (position, below, above) in the values ordered by group
    for q in qs:
        pos = starts[present] + q * (counts[present] - 1)
        places.append((pos, np.floor(pos).astype(np.int64), np.ceil(pos).astype(np.int64)))
    # Only the values at those ranks are read: a partial sort gives them.
    ranks = np.unique(np.concatenate([r for _, lo, hi in places for r in (lo, hi)]))
    v = _sorted_by_group(group, values, n_groups, at=ranks)
    results = []
    for pos, lo, hi in places:
        out = np.full(n_groups, np.nan)
        below, above = v[lo].astype(np.float64), v[hi].astype(np.float64)
        out[present] = below + (above - below) * (pos - lo)
        results.append(out)
    return tuple(results)


def _sorted_by_group(
    group: IntArray, values: IntArray, n_groups: int, at: IntArray | None = None
) -> IntArray:
    """`values` ordered by (group, value); with `at`, only the entries at those positions are
    sure to be in place (a partial sort, np.partition's). Where both fit in 63 bits as one key
    (durations ≥ 0 and below 2**40 ns with up to 2**23 groups, say), one sort (or partition)
    of the keys: rows are not needed, only the values, and it is ~3× faster than lexsort's two
    stable sorts."""
    if not len(values):
        return values
    shift = int(values.max()).bit_length()
    if int(values.min()) >= 0 and shift + max(n_groups - 1, 1).bit_length() <= 63:
        keys = (group << shift) | values
        if at is None:
            keys.sort()
        else:
            keys = np.partition(keys, at)
        result: IntArray = keys & ((1 << shift) - 1)
        return result
    return values[np.lexsort((values, group))]


def _list_column(matrix: npt.NDArray[Any], width: int) -> pa.Array:
    flat = pa.array(matrix.reshape(-1), pa.float32())
    offsets = pa.array(np.arange(0, matrix.shape[0] * width + 1, width, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, flat)
