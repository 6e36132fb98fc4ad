"""Findings and evidence from the cross-rank collective analysis (analyzer/compare/collectives.py).

* A slow link → `slow_worker` / `network` naming the rank, its transfer time and bandwidth
  against its peers', and the ranks waiting for it (victims, reported as such).
* Every `slow_worker` finding gains a `collectives` evidence block for its ranks: how often
  they arrived last, the waiting they caused, their own wait and transfer per step — the
  late-arriver view that confirms (or not) the culprit named from the summaries.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from perfdiag.analyzer.compare.collectives import CollectiveAnalysis, SlowLink
from perfdiag.analyzer.compare.features import Features
from perfdiag.analyzer.findings.reported import MAX_RANKS_IN_EVIDENCE, Reported
from perfdiag.analyzer.text import NEXT_STEP, ms, pct, ranks_phrase, waits
from perfdiag.api.verdict import Finding


def _round(x: float, digits: int = 3) -> float | None:
    return round(float(x), digits) if np.isfinite(x) else None


def rank_evidence(analysis: CollectiveAnalysis, features: Features, rank: int) -> dict[str, Any]:
    pos = int(np.searchsorted(features.ranks, rank))
    r = analysis.per_rank
    peers = np.arange(len(features.ranks)) != pos
    return {
        "arrived_last_share": _round(r.last_share[pos]),
        "peers_median_arrived_last_share": _round(float(np.median(r.last_share[peers])))
        if peers.any()
        else None,
        "caused_wait_ms_per_step": _round(r.caused_wait_ms[pos]),
        "wait_ms_per_step": _round(r.wait_ms[pos]),
        "transfer_ms_per_step": _round(r.transfer_ms[pos]),
        "busbw_GBps": _round(r.busbw_mu[pos], 2),
        "matched_calls": int(r.calls[pos]),
        "clocks": "aligned" if analysis.instances.clock_aligned else "not comparable (durations)",
    }


def annotate_slow_workers(
    reported: list[Reported], analysis: CollectiveAnalysis | None, features: Features
) -> list[Reported]:
    """Add the late-arriver evidence to slow_worker findings."""
    if analysis is None:
        return reported
    out = []
    for item in reported:
        finding = item.finding
        if (
            finding.kind == "slow_worker"
            and finding.ranks
            and "collectives" not in finding.evidence
        ):
            evidence = dict(finding.evidence)
            evidence["collectives"] = {
                str(r): rank_evidence(analysis, features, r)
                for r in finding.ranks[:20]
                if r in set(features.ranks.tolist())
            }
            finding = finding.model_copy(update={"evidence": evidence})
            item = Reported(finding=finding, headline=item.headline)
        out.append(item)
    return out


def slow_link_findings(analysis: CollectiveAnalysis | None, features: Features) -> list[Reported]:
    if analysis is None:
        return []
    return [_slow_link(link, analysis, features) for link in analysis.slow_links]


def _slow_link(link: SlowLink, analysis: CollectiveAnalysis, features: Features) -> Reported:
    bandwidth = ""
    if np.isfinite(link.busbw) and np.isfinite(link.peers_busbw):
        bandwidth = (
            f"; bus bandwidth {link.busbw:.1f} GB/s vs its peers' {link.peers_busbw:.1f} GB/s"
        )
    steps = (
        f"in {link.steps_outlying}/{link.steps} steps"
        if link.steps_outlying >= 0
        else f"persistence not judged ({link.steps} steps)"
    )
    message = (
        f"Rank {link.rank}'s collectives transfer {ms(link.excess_ms)}/step longer than its "
        f"peers' once every rank has arrived ({ms(link.transfer_ms)} vs {ms(link.peers_transfer_ms)}"
        f"/step{bandwidth}). That is {pct(link.severity)} of the {ms(link.step_ms)} step, {steps})."
    )
    if link.victims:
        message += (
            f" {ranks_phrase(link.victims, capital=True)} {waits(link.victims)} for it "
            f"({ms(link.victims_wait_ms)}/step, median): they are victims, not culprits."
        )
    message += f" Cause: network (its link moves data slower). Next: {NEXT_STEP['network']}."
    headline = (
        f"Rank {link.rank}'s link is slow: its collectives transfer {ms(link.excess_ms)}/step "
        f"longer than its peers'{bandwidth.replace(';', ',')}"
    )
    finding = Finding(
        kind="slow_worker",
        category="network",
        function=None,
        ranks=[link.rank],
        severity=round(link.severity, 4),
        evidence={
            "transfer_ms_per_step": round(link.transfer_ms, 3),
            "peers_median_transfer_ms_per_step": round(link.peers_transfer_ms, 3),
            "excess_ms_per_step": round(link.excess_ms, 3),
            "robust_z": _round(link.robust_z),
            "steps_outlying": link.steps_outlying if link.steps_outlying >= 0 else None,
            "steps": link.steps,
            "busbw_GBps": _round(link.busbw, 2),
            "peers_median_busbw_GBps": _round(link.peers_busbw, 2),
            "victims": {
                "ranks": link.victims[:MAX_RANKS_IN_EVIDENCE],
                "count": len(link.victims),
                "wait_ms_per_step": round(link.victims_wait_ms, 3),
                "note": "these ranks wait in the collectives this rank arrives last at",
            },
            "collectives": rank_evidence(analysis, features, link.rank),
            "root_cause": {
                "category": "network",
                "basis": "transfer time after every rank arrived (not waiting) is higher, "
                "so the rank's achieved bandwidth is lower",
            },
        },
        message=message,
    )
    return Reported(finding=finding, headline=headline + ".")


def without_explained_waiting(
    reported: list[Reported], analysis: CollectiveAnalysis | None, features: Features
) -> list[Reported]:
    """Drop 'its collectives are slower' findings (fusion.communication_outliers) that the
    cross-rank split explains as waiting: when most of the rank's extra communication is time
    before the last rank arrived, the rank is a victim (of a peer, or of a rank in another
    role, e.g. the next pipeline stage), and its own transfers are not slower."""
    if analysis is None:
        return reported
    slow_links = {link.rank for link in analysis.slow_links}
    out = []
    for item in reported:
        finding = item.finding
        rank = finding.ranks[0] if len(finding.ranks) == 1 else None
        excess = finding.evidence.get("unexplained_ms_per_step")
        if rank is not None and (
            rank in slow_links or _mostly_waiting(analysis, features, rank, excess)
        ):
            continue
        out.append(item)
    return out


def _mostly_waiting(
    analysis: CollectiveAnalysis, features: Features, rank: int, excess: object
) -> bool:
    if not isinstance(excess, float | int) or rank not in set(features.ranks.tolist()):
        return False
    pos = int(np.searchsorted(features.ranks, rank))
    r = analysis.per_rank
    peers = np.arange(len(features.ranks)) != pos
    extra_wait = float(r.wait_ms[pos] - np.median(r.wait_ms[peers])) if peers.any() else 0.0
    return r.calls[pos] > 0 and extra_wait >= 0.5 * float(excess)
