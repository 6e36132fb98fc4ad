"""Slow nodes: most of one machine's ranks slow together for one cause (analyzer/findings/nodes.py)."""

from __future__ import annotations

from perfdiag.analyzer.findings.nodes import slow_node_findings
from perfdiag.analyzer.findings.reported import Reported
from perfdiag.api.schema import WindowMeta, WorkerMeta
from perfdiag.api.verdict import Finding

WINDOW = WindowMeta(id="w", start_step=1, steps=2, step_bounds_ns=[(0, 10), (10, 20)])


def metas(hosts: dict[int, str]) -> dict[int, WorkerMeta]:
    return {
        rank: WorkerMeta(rank=rank, host=host, pod=f"job-worker-{rank}", window=WINDOW)
        for rank, host in hosts.items()
    }


def slow(ranks: list[int], category: str = "cpu_op", severity: float = 0.3) -> Reported:
    workers = [{"rank": r, "excess_ms_per_step": 6.0, "step_ms": 20.0} for r in ranks]
    finding = Finding(
        kind="slow_worker",
        category=category,  # type: ignore[arg-type]
        function="train.py(9): extra",
        ranks=ranks,
        severity=severity,
        evidence={"workers": workers, "worker_count": len(ranks)},
        message="…",
    )
    return Reported(finding=finding, headline="…")


TWO_NODES = {0: "a", 1: "a", 2: "a", 3: "a", 4: "b", 5: "b", 6: "b", 7: "b"}


def test_most_ranks_of_one_node_slow_for_one_cause_are_one_slow_node() -> None:
    out = slow_node_findings([slow([4, 5, 6])], metas(TWO_NODES))
    assert [r.finding.kind for r in out] == ["slow_node"]
    node = out[0].finding
    assert node.ranks == [4, 5, 6] and node.category == "cpu_op" and node.severity == 0.3
    assert node.evidence["node"] == "b" and node.evidence["node_ranks"] == "4-7"
    assert node.evidence["pods"] == ["job-worker-4", "job-worker-5", "job-worker-6"]
    assert node.message.startswith("Node b is slow: 3 of its 4 ranks (4-6)")


def test_a_slow_rank_on_another_node_keeps_its_own_finding() -> None:
    out = slow_node_findings([slow([1, 4, 5, 6, 7])], metas(TWO_NODES))
    kinds = {r.finding.kind: r.finding for r in out}
    assert kinds["slow_node"].ranks == [4, 5, 6, 7]
    assert kinds["slow_worker"].ranks == [1]
    assert [w["rank"] for w in kinds["slow_worker"].evidence["workers"]] == [1]


def test_no_slow_node_for_a_minority_of_a_node_different_causes_or_one_host() -> None:
    findings = [slow([4, 5])]  # half of node b, not most
    assert slow_node_findings(findings, metas(TWO_NODES)) == findings
    findings = [slow([4, 5]), slow([6], category="python")]  # two causes on b
    assert slow_node_findings(findings, metas(TWO_NODES)) == findings
    findings = [slow([4, 5, 6])]
    assert slow_node_findings(findings, metas(dict.fromkeys(range(8), "a"))) == findings
    # Every node slow: a job-wide problem, not one node's.
    findings = [slow([1, 2, 3, 5, 6, 7])]
    assert slow_node_findings(findings, metas(TWO_NODES)) == findings
