"""Slow nodes: most of one machine's ranks slow together, for one cause.

A machine that is slower than the others (a throttled CPU, a noisy neighbour, a degraded GPU
or NIC) makes every rank on it a culprit. Listing its 8 ranks as 8 slow workers leaves the
grouping to the reader; the finding the user needs is the node. When the ranks named as slow
workers share a host (WorkerMeta.host: the pod's spec.nodeName on Kubernetes, the hostname in
a local run) and they are most of that host's ranks, with one cause, one `slow_node` finding
names the node, its pods and the ranks under it, and replaces their slow_worker (and
function_anomaly) findings. Other hosts' ranks keep their own findings.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from perfdiag.analyzer.findings.reported import Reported
from perfdiag.analyzer.load.worker_table import WorkerMetas
from perfdiag.analyzer.text import NEXT_STEP, format_ranks, ms, pct, short
from perfdiag.api.schema import WorkerMeta
from perfdiag.api.verdict import Finding

MIN_SHARE = 0.5
"""More than this share of a node's analysed ranks are slow (and at least two of them)."""
ABSORBED = frozenset({"slow_worker", "function_anomaly"})
NODE_NEXT_STEP = (
    "check that machine rather than the code: other processes on it, its CPU frequency and "
    "thermal or power throttling, its GPUs' clocks and its NIC; compare it with a healthy node "
    "of the same type, and cordon it if it stays slow"
)


def slow_node_findings(reported: list[Reported], metas: Mapping[int, WorkerMeta]) -> list[Reported]:
    """`reported` with each slow node's slow_worker and function_anomaly findings fused into
    one slow_node finding; unchanged when the job runs on one host or no node is slow."""
    nodes = WorkerMetas.of(metas).nodes()
    if nodes.distinct() < 2:
        return reported
    slow = [r for r in reported if r.finding.kind == "slow_worker"]
    # Only the hosts of slow ranks can be slow nodes (a node needs two culprits on it).
    host_of = nodes.host_of(k for r in slow for k in r.finding.ranks)
    out = list(reported)
    for host in sorted(set(host_of.values())):
        ranks = nodes.ranks_on(host)
        mine = [r for r in slow if any(host_of.get(rank) == host for rank in r.finding.ranks)]
        culprits = sorted({k for r in mine for k in r.finding.ranks if host_of.get(k) == host})
        if len(culprits) < 2 or len(culprits) <= MIN_SHARE * len(ranks):
            continue
        if len({r.finding.category for r in mine}) != 1:
            continue  # different causes on one machine: each stays a slow worker
        others = nodes.with_host() - len(ranks)
        slow_elsewhere = {k for r in slow for k in r.finding.ranks if host_of.get(k) != host}
        if len(slow_elsewhere) > MIN_SHARE * others:
            continue  # most machines are slow: not one node's problem
        node = _node_finding(host, ranks, culprits, mine, metas)
        kept = (_without_ranks(r, set(culprits)) for r in out)
        out = [*(r for r in kept if r is not None), node]
    return out


def _without_ranks(reported: Reported, ranks: set[int]) -> Reported | None:
    finding = reported.finding
    if finding.kind not in ABSORBED or not ranks & set(finding.ranks):
        return reported
    kept = [r for r in finding.ranks if r not in ranks]
    if not kept:
        return None
    evidence = dict(finding.evidence)
    if isinstance(evidence.get("workers"), list):
        evidence["workers"] = [w for w in evidence["workers"] if w.get("rank") not in ranks]
        evidence["worker_count"] = len(kept)
    return Reported(
        finding=finding.model_copy(update={"ranks": kept, "evidence": evidence}),
        headline=reported.headline,
    )


def _node_finding(
    host: str,
    node_ranks: list[int],
    culprits: list[int],
    members: list[Reported],
    metas: Mapping[int, WorkerMeta],
) -> Reported:
    lead = max(members, key=lambda r: r.finding.severity).finding
    workers: list[dict[str, Any]] = [
        w
        for r in members
        for w in r.finding.evidence.get("workers", [])
        if isinstance(w, dict) and w.get("rank") in culprits
    ]
    excess = [float(w["excess_ms_per_step"]) for w in workers if "excess_ms_per_step" in w]
    # The step the severity is a share of: the most severe rank's (as its slow_worker said).
    timed = [w for w in workers if "excess_ms_per_step" in w and w.get("step_ms")]
    steps = [
        float(w["step_ms"])
        for w in sorted(timed, key=lambda w: -float(w["excess_ms_per_step"]) / float(w["step_ms"]))
    ]
    pods = sorted({p for k in culprits if (p := metas[k].pod)})
    functions = {r.finding.function for r in members}
    function = functions.pop() if len(functions) == 1 else None
    category = lead.category
    share = (
        f"all {len(node_ranks)} of its ranks"
        if len(culprits) == len(node_ranks)
        else f"{len(culprits)} of its {len(node_ranks)} ranks"
    )
    amount = (
        f" {ms(min(excess))}–{ms(max(excess))}/step more than the ranks of other nodes"
        f" outside communication ({pct(lead.severity)} of the {ms(steps[0])} step)"
        if excess and steps
        else ""
    )
    cause = f"{category}" + (f", mostly {short(function)}" if function else "")
    message = (
        f"Node {host} is slow: {share} ({format_ranks(culprits)}) spend{amount}, all for one "
        f"cause ({cause})."
        + (f" Pods: {', '.join(pods)}." if pods else "")
        + f" Next: {NODE_NEXT_STEP}. If these ranks run other work than the rest: "
        f"{NEXT_STEP.get(category, 'look at what they run')}."
    )
    headline = (
        f"Node {host} is slowing the job: {share} are slow together ({cause}, "
        f"{pct(lead.severity)} of the step)"
    )
    finding = Finding(
        kind="slow_node",
        category=category,
        function=function,
        ranks=culprits,
        severity=lead.severity,
        evidence={
            "node": host,
            "pods": pods,
            "node_ranks": format_ranks(node_ranks),
            "slow_ranks": len(culprits),
            "workers": workers,
        },
        message=message,
    )
    return Reported(finding=finding, headline=headline + ".")
