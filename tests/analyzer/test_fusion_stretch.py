"""A rank that computes longer only because the same work ran slower on its CPU is not named
(analyzer/fusion.py `_stretched`)."""

from __future__ import annotations

from perfdiag.analyzer.cpu_cause import CpuCause
from perfdiag.analyzer.fusion import Contributor, SlowWorker, _stretched


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


def test_extra_computation_spread_over_everything_is_a_slower_cpu() -> None:
    spread = worker(8.2, [("dataloader", 0.6), ("cpu_op", 0.5), ("python", 0.5)])
    note = _stretched(spread, WORK)
    assert note is not None and "the same work ran slower on its CPU" in note


def test_extra_computation_one_category_holds_is_the_ranks_own() -> None:
    assert _stretched(worker(8.2, [("cpu_op", 1.8), ("python", 0.2)]), WORK) is None
    blocked = CpuCause("blocked", 2.2, WORK.evidence, "")
    assert _stretched(worker(8.2, [("python", 0.1)]), blocked) is None
