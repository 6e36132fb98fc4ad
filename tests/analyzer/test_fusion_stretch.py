"""A rank that computes longer only because the same work ran slower on its CPU is not named
(analyzer/findings/naming.py `_stretched`, `_same_calls_slower`)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from perfdiag.analyzer.compare.features import StepTimes, build_features
from perfdiag.analyzer.compare.outliers import compare_peers
from perfdiag.analyzer.compare.peers import one_group
from perfdiag.analyzer.findings.naming import _same_calls_slower, _stretched
from perfdiag.analyzer.findings.slow_worker import Contributor, SlowWorker
from perfdiag.analyzer.findings.suspects import PeerContext, Suspect
from perfdiag.analyzer.signals.cpu_cause import CpuCause, CpuWork
from perfdiag.api.thresholds import Thresholds


def contributor(category: str, excess: float) -> Contributor:
    return Contributor(None, category, 0.0, 0.0, 0.0, excess, 0.0, 0.0, 0.0, 1.0, 10, 10, True)


def worker(non_wait: float, categories: list[tuple[str, float]]) -> SlowWorker:
    rows = [contributor(c, e) for c, e in categories]
    return SlowWorker(
        rank=1, position=1, group=0, step_ms=12.0, excess_ms=2.2, non_wait_ms=non_wait,
        peers_non_wait_ms=6.0, steps_outlying=10, steps=10, peer_count=1,
        contributors=rows[:1], categories=rows, root_category="cpu_op", root_basis="",
    )  # fmt: skip


WORK = CpuCause(
    "work", 2.2, {"on_cpu_ms_per_step": {"rank": 8.1, "peers_median": 6.0}}, "", own_ms=2.2
)


def stretched(
    rank: SlowWorker, cause: CpuCause, rank1: list[Row] | None = None, work: CpuWork | None = None
) -> str | None:
    """`_stretched` for rank 1 of two whose windows hold SAME_CALLS (rank 1: `rank1`), with
    its extra computation step by step `work`."""
    rows = {0: SAME_CALLS, 1: rank1 if rank1 is not None else SLOWER_CALLS}
    return _stretched(suspect_of(rows, 1, work), rank, cause)


def test_extra_computation_spread_over_everything_is_a_slower_cpu() -> None:
    spread = worker(8.2, [("dataloader", 0.6), ("cpu_op", 0.5), ("python", 0.5)])
    note = stretched(spread, WORK)
    assert note is not None and "the same work ran slower on its CPU" in note


def test_extra_computation_spread_over_everything_even_in_the_best_step_is_more_work() -> None:
    """A 3x batch grows every function of the rank together, in every step: its best step
    1.64x its peers' best (fault suite), where a healthy rank on a shared core keeps 1.12."""
    spread = worker(8.2, [("dataloader", 0.6), ("cpu_op", 0.5), ("python", 0.5)])
    assert stretched(spread, WORK, work=cpu_work(1.64)) is None
    note = stretched(spread, WORK, work=cpu_work(1.12))
    assert note is not None and "the same work ran slower on its CPU" in note


def test_extra_computation_one_category_holds_is_the_ranks_own() -> None:
    assert stretched(worker(8.2, [("cpu_op", 1.8), ("python", 0.2)]), WORK) is None
    blocked = CpuCause("blocked", 2.2, WORK.evidence, "")
    assert stretched(worker(8.2, [("python", 0.1)]), blocked) is None


def test_extra_calls_spread_over_python_ops_and_launches_are_the_ranks_own() -> None:
    """Measured on an H100: a rank launching thousands of one-element kernels spends its extra
    time in Python, aten ops and kernel launches alike (none holds half), all of it in calls
    its peer does not make."""
    spread = worker(8.2, [("cuda_runtime", 0.8), ("cpu_op", 0.7), ("python", 0.4)])
    launches = [
        *SAME_CALLS,
        ("cudaLaunchKernel", "cuda_runtime", 0.8, 300),
        ("aten::add_", "cpu_op", 0.7, 300),
        ("add_", "python", 0.4, 300),
    ]
    assert stretched(spread, WORK, launches) is None


def suspect_of(
    rows: dict[int, list[Row]],
    position: int,
    work: CpuWork | None = None,
    steps: int = 10,
    inclusive: dict[tuple[int, str], float] | None = None,
) -> Suspect:
    """Rank `position` among ranks whose windows hold `rows`: (function, category, ms, calls)
    each, over `steps` steps of 20 ms; `inclusive`: (rank, function) → inclusive ms per step
    where it is more than the function's own (its time charged to what it calls)."""
    walls = inclusive or {}
    table = pa.table(
        {
            "rank": pa.array([r for r, fs in rows.items() for _ in fs], pa.int32()),
            "function": [f for fs in rows.values() for f, _, _, _ in fs],
            "category": [c for fs in rows.values() for _, c, _, _ in fs],
            "time_ms": [ms * steps for fs in rows.values() for _, _, ms, _ in fs],
            "count": pa.array([n * steps for fs in rows.values() for _, _, _, n in fs], pa.int64()),
            "wall_ms": [
                walls.get((r, f), ms) * steps for r, fs in rows.items() for f, _, ms, _ in fs
            ],
            "beta_per_step": [[ms / 20.0] * steps for fs in rows.values() for _, _, ms, _ in fs],
        }
    )
    ranks = np.array(sorted(rows), dtype=np.int64)
    features = build_features(
        table, StepTimes(ranks, np.full((len(ranks), steps), 20.0)), min_beta=0.0
    )
    groups, thresholds = one_group(features), Thresholds()
    dev = compare_peers(table, features, groups, thresholds)
    reference = np.ones(len(ranks), dtype=bool)
    context = PeerContext(features, dev, groups, thresholds, reference, host=None, cpu=None)
    return Suspect(context, position, work)


Row = tuple[str, str, float, int]
HEALTHY = [("aten::mm", "cpu_op", 4.0, 11), ("fetch", "dataloader", 2.0, 1)]
SAME_CALLS = [
    ("aten::mm", "cpu_op", 4.0, 11),
    ("fetch", "dataloader", 2.0, 1),
    ("f", "python", 1.0, 3),
]
SLOWER_CALLS = [
    ("aten::mm", "cpu_op", 4.5, 11),
    ("fetch", "dataloader", 2.6, 1),
    ("f", "python", 1.5, 3),
]


def cpu_work(floor_ratio: float) -> CpuWork:
    return CpuWork(2.0, 7.5, 6.0, 8, 8, floor_ratio)


def same_calls_note(rank3: list[tuple[str, str, float, int]], floor: float) -> str | None:
    work = cpu_work(floor)
    suspect = suspect_of({0: HEALTHY, 1: HEALTHY, 2: HEALTHY, 3: rank3}, 3, work)
    return _same_calls_slower(suspect, work)


def test_the_same_calls_taking_a_little_longer_are_a_shared_cpu() -> None:
    """A healthy rank whose core other busy threads share: its best step 1.18x its peers'
    (test_cpu_cause.SHARED_CORE)."""
    slower = [("aten::mm", "cpu_op", 5.0, 11), ("fetch", "dataloader", 2.5, 1)]
    note = same_calls_note(slower, 1.18)
    assert note is not None and "in the same calls as theirs" in note
    assert "in its best step ×1.18 their best" in note


def test_the_same_calls_longer_even_in_the_best_step_are_the_ranks_own_work() -> None:
    """A 3x batch: the same calls, each with more work, its best step 1.66x its peers'
    (test_cpu_cause.LARGER_BATCH)."""
    larger = [("aten::mm", "cpu_op", 7.0, 11), ("fetch", "dataloader", 3.5, 1)]
    assert same_calls_note(larger, 1.66) is None


def test_calls_its_peers_do_not_make_are_the_ranks_own_work() -> None:
    more_calls = [("aten::mm", "cpu_op", 5.5, 19), ("fetch", "dataloader", 2.0, 1)]
    assert same_calls_note(more_calls, 1.2) is None
    alone = [*HEALTHY, ("tokenize", "python", 1.5, 1)]
    assert same_calls_note(alone, 1.2) is None


def test_more_calls_whose_time_is_charged_to_what_they_run_are_the_ranks_own_work() -> None:
    """A 3x batch through a DataLoader: the dataset's `__getitem__` is called 3x as often, its
    time charged to the ops it runs and to the loader's list comprehension, which is called
    as often as on the peers (fault suite: 384 calls a step against 128, its inclusive time
    3.2 ms against 1.2 ms, the list comprehension's own time 3.3 ms against 1.3 ms)."""

    def loader(getitem_calls: int, fetch_ms: float) -> list[Row]:
        return [
            ("aten::mm", "cpu_op", 4.0, 11),
            ("fetch.py(54): <listcomp>", "dataloader", fetch_ms, 1),
            ("fault_job.py(96): __getitem__", "python", 0.0, getitem_calls),
        ]

    peers = {r: loader(128, 1.3) for r in range(3)}
    walls = {(r, "fault_job.py(96): __getitem__"): 1.2 for r in range(3)}
    larger = suspect_of(
        {**peers, 3: loader(384, 3.3)}, 3, cpu_work(1.44),
        inclusive={**walls, (3, "fault_job.py(96): __getitem__"): 3.2},
    )  # fmt: skip
    assert _same_calls_slower(larger, cpu_work(1.44)) is None
    # The same calls, the list comprehension slower: a shared core.
    slower = suspect_of(
        {**peers, 3: loader(128, 3.3)}, 3, cpu_work(1.18),
        inclusive={**walls, (3, "fault_job.py(96): __getitem__"): 3.2},
    )  # fmt: skip
    note = _same_calls_slower(slower, cpu_work(1.18))
    assert note is not None and "in the same calls as theirs" in note
