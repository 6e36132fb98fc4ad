"""The engine's fast paths give what the plain way gives: the per-rank ingest (scanner,
Arrow columns, events table, critical path, summary) was made faster piece by piece, each
piece kept identical to the computation it replaced (docs/benchmarks.md, "Kineto ingest, stage
by stage"). Each fast path is compared with the plain one on random inputs, ties and edge
values included; the readers on the shared GPT-2 trace."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfdiag.api import taxonomy
from perfdiag.engine import critical_path, summary
from perfdiag.engine.kineto import events as kineto_events
from perfdiag.engine.kineto import load_trace

GPT2 = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "gpu-gpt2"
SETTINGS = settings(max_examples=150, deadline=None)


@SETTINGS
@given(
    steps=st.lists(st.integers(0, 3), min_size=0, max_size=60),
    minor=st.lists(st.integers(-5, 5), min_size=60, max_size=60),
    major=st.lists(st.integers(0, 3), min_size=60, max_size=60),
    with_minor=st.booleans(),
)
def test_rank_by_start_is_lexsort(
    steps: list[int], minor: list[int], major: list[int], with_minor: bool
) -> None:
    # Starts nearly in order, many of them equal (ties in start and in minor alike).
    start = np.cumsum(np.array(steps, dtype=np.int64))
    n = len(start)
    low = np.array(minor[:n], dtype=np.int64)
    high = np.array(major[:n], dtype=np.int8)
    if with_minor:
        expected = np.lexsort((low, start, high))
        rank, order = critical_path._rank_by_start(start, low, high)
    else:
        expected = np.lexsort((start, high))
        rank, order = critical_path._rank_by_start(start, None, high)
    assert order.tolist() == expected.tolist()
    assert (rank[order] == np.arange(n)).all()


@SETTINGS
@given(
    keys=st.lists(st.integers(0, 300), max_size=80),
    values=st.lists(st.integers(0, 10**12), min_size=80, max_size=80),
)
def test_pair_sums_by_counting_and_by_sorting_agree(keys: list[int], values: list[int]) -> None:
    pair = np.array(keys, dtype=np.int64)
    ns = np.array(values[: len(keys)], dtype=np.int64)
    if not len(pair):
        return
    counted, counted_sums = critical_path._sums_by_counting(pair, ns)
    sorted_keys, sorted_sums = critical_path._sums_by_sorting(pair, ns)
    assert counted.tolist() == sorted_keys.tolist()
    assert counted_sums.astype(np.int64).tolist() == sorted_sums.tolist()


@SETTINGS
@given(
    groups=st.lists(st.integers(0, 6), max_size=60),
    values=st.lists(
        st.one_of(st.integers(0, 50), st.integers(-(2**62), 2**62)), min_size=60, max_size=60
    ),
)
def test_values_sorted_by_group_as_lexsort(groups: list[int], values: list[int]) -> None:
    group = np.array(groups, dtype=np.int64)
    value = np.array(values[: len(groups)], dtype=np.int64)
    expected = value[np.lexsort((value, group))]
    assert summary._sorted_by_group(group, value, 7).tolist() == expected.tolist()


@SETTINGS
@given(
    groups=st.lists(st.integers(0, 6), max_size=60),
    values=st.lists(st.one_of(st.integers(0, 50), st.integers(0, 2**40)), min_size=60, max_size=60),
)
def test_group_quantiles_from_a_partial_sort_are_numpys(
    groups: list[int], values: list[int]
) -> None:
    group = np.array(groups, dtype=np.int64)
    value = np.array(values[: len(groups)], dtype=np.int64)
    median, p95 = summary._quantiles(group, value, 7, (0.5, 0.95))
    for g in range(7):
        of_group = value[group == g]
        if not len(of_group):
            assert np.isnan(median[g]) and np.isnan(p95[g])
            continue
        assert median[g] == pytest.approx(np.quantile(of_group, 0.5), rel=1e-12, abs=1e-9)
        assert p95[g] == pytest.approx(np.quantile(of_group, 0.95), rel=1e-12, abs=1e-9)


@SETTINGS
@given(values=st.lists(st.integers(0, 40), max_size=60), wide=st.booleans())
def test_distinct_inverse_counting_and_sorting_agree(values: list[int], wide: bool) -> None:
    if not values:  # _groups returns before asking
        return
    array = np.array(values, dtype=np.int64)
    bound = 10**9 if wide else 41  # past the counting bound: the sort
    distinct, inverse = summary._distinct_inverse(array, bound)
    assert distinct.tolist() == sorted(set(values))
    assert (distinct[inverse] == array).all()


CATS = ["cpu_op", "kernel", "python_function", "user_annotation", "perfdiag", "gpu_memcpy", ""]
NAMES = [
    "aten::mm",
    "ncclDevKernel_AllReduce_Sum_f32",
    "gloo:all_reduce",
    "torch/utils/data/dataloader.py(1): __next__",
    "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
    "ProfilerStep#3",
    "c10d::allreduce_",
    "<built-in method wait of torch._C._distributed_c10d.Work object at 0x7f>",
    "<perfdiag>",
]


@SETTINGS
@given(
    rows=st.lists(st.tuples(st.sampled_from(CATS), st.sampled_from(NAMES)), max_size=50),
    own_rows=st.integers(0, 3),
)
def test_categories_per_pair_are_the_categories_per_row(
    rows: list[tuple[str, str]], own_rows: int
) -> None:
    cat = taxonomy.distinct(pa.array([c for c, _ in rows], pa.string()))
    name = taxonomy.distinct(pa.array([n for _, n in rows], pa.string()))
    per_row = kineto_events._own_time_idle_class(cat, taxonomy.categorize(cat, name))
    expected = per_row.to_pylist() + ["annotation"] * own_rows
    got, communication = kineto_events._categories(cat, name, own_rows)
    assert got.to_pylist() == expected
    assert communication.tolist() == [c == "communication" for c in expected]


@SETTINGS
@given(names=st.lists(st.sampled_from([*NAMES, "f at 0x1", "f at 0x2", "ProfilerStep#9"])))
def test_function_names_of_distinct_names_are_taxonomys(names: list[str]) -> None:
    column = pa.array(names, pa.string())
    expected = taxonomy.distinct(taxonomy.function_names(column))
    got = summary._function_names(column)
    assert got.values.to_pylist() == expected.values.to_pylist()
    assert got.codes.tolist() == expected.codes.tolist()


def _trace(tmp: Path, events: list[dict[str, object]], dur_texts: list[str]) -> Path:
    """A trace whose durations are written as given (the scanner reads the text)."""
    text = json.dumps({"traceEvents": events}, indent=1)
    for k, dur in enumerate(dur_texts):
        text = text.replace(f'"dur": "D{k}"', f'"dur": {dur}', 1)
    path = tmp / "rank-0.json"
    path.write_text(text)
    return path


_DURATIONS = st.builds(
    lambda sign, whole, fraction, exponent: f"{sign}{whole}{fraction}{exponent}",
    st.sampled_from(["", "-"]),
    st.sampled_from(["0", "1", "31", "4921501", "123456789012345", "9007199254740993"]),
    st.one_of(st.just(""), st.from_regex(r"\.[0-9]{1,12}", fullmatch=True)),
    st.sampled_from(["", "", "", "e3", "E-2"]),
)


@SETTINGS
@given(durations=st.lists(_DURATIONS, min_size=1, max_size=8))
def test_durations_read_as_pythons_float(durations: list[str]) -> None:
    """The scanner's shortcut for durations (digits / 10^k, one rounding) gives the float
    Python's json gives, whatever the digits; negative durations are refused alike."""
    events: list[dict[str, object]] = [
        {"ph": "X", "cat": "cpu_op", "name": "f", "pid": 1, "tid": 1, "ts": k, "dur": f"D{k}"}
        for k in range(len(durations))
    ]
    with tempfile.TemporaryDirectory() as folder:
        path = _trace(Path(folder), events, durations)
        try:
            general = load_trace(path, fast=False).events
        except ValueError as exc:
            with pytest.raises(ValueError) as fast_error:
                load_trace(path)
            assert str(fast_error.value) == str(exc)
            return
        fast = load_trace(path)
    assert fast.events.equals(general), (durations, fast.events["dur_ns"], general["dur_ns"])


def test_an_event_longer_than_the_bridge_between_pieces(tmp_path: Path) -> None:
    """The fast reader completes the event a piece cut off with a little of the next piece;
    an event longer than that takes the whole next piece, and the table is the same."""
    long_name = "x" * 5000
    events = [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": long_name if k % 7 == 3 else f"op{k}",
            "pid": 1,
            "tid": 1,
            "ts": k,
            "dur": 1,
        }
        for k in range(200)
    ]
    path = tmp_path / "rank-0.json"
    path.write_text(json.dumps({"traceEvents": events}, indent=2))
    general = load_trace(path, fast=False).events
    for piece in (512, 4096, 6000, 1 << 20):
        read = load_trace(path, piece=piece)
        assert read.fast and read.events.equals(general), piece


@pytest.mark.skipif(not GPT2.exists(), reason="no shared GPT-2 traces")
def test_the_fast_reader_reads_the_gpu_trace_as_the_general_reader() -> None:
    """A real GPU trace of perfdiag's hook (108k complete events, escapes, labels as pids)."""
    path = GPT2 / "healthy" / "rank-0.json.gz"
    fast = load_trace(path)
    assert fast.fast
    assert fast.events.equals(load_trace(path, fast=False).events)
