"""Group-level load imbalance: work spread unevenly across ranks, a different rank slowest in
different steps (uneven sequence or video lengths: EROICA's case), so that no rank is an
outlier over the window while every step waits for that step's slowest rank.

Per step and peer group, from each rank's training-thread CPU time (`HostUsage.main_run_ms`;
run-queue wait is not work), when the samples are fine enough to tell steps apart: the job loses the slowest rank's time over the median rank's. An
`imbalance` finding is reported when that loss averages at least `MIN_LOSS` of the step, the
spread shows in most steps, and no single rank is the slowest in most of them (that rank would
be a slow worker, judged elsewhere); on a host with more runnable threads than cores, the
slowest rank's work must also be `MIN_SHARED_HOST_SPREAD` over the median rank's.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from perfdiag.analyzer.compare.features import Features
from perfdiag.analyzer.compare.peers import PeerGroups
from perfdiag.analyzer.findings.fusion import Fusion
from perfdiag.analyzer.findings.reported import Reported
from perfdiag.analyzer.signals.host_usage import outside_communication
from perfdiag.analyzer.text import format_ranks, ms, pct
from perfdiag.api.schema import WorkerMeta
from perfdiag.api.verdict import Finding

MIN_LOSS = 0.10
"""Mean loss per step (slowest rank's work over the median rank's), as a share of the step."""
MIN_STEPS_SHOWN = 0.5
"""The spread reaches half of MIN_LOSS in at least this share of the steps."""
MAX_SLOWEST_SHARE = 0.5
"""No rank is the slowest in more than this share of the steps."""
MIN_SHARED_HOST_SPREAD = 0.4
"""On a host with more runnable threads than cores, the slowest rank's work must also be at
least this much over the median rank's, on average over the steps: there the same work varies
from rank to rank by up to 0.27 (healthy runs, 4 ranks on 2 cores, quiet and beside a CPU
hog), while uneven inputs vary by 0.6 and more."""
MIN_GROUP = 3
MAX_RANKS = 4096
"""Above this many ranks in a group, the ranks compared are the group's slowest by window."""


MAX_SAMPLE_GAP = 0.25
"""Per-step CPU times sampled from outside (not read by the hook at each step boundary) are
judged only when the sampler's gaps (95th percentile) stay below this
share of the step: on a busy host the sampler waits for a CPU too, and a value interpolated
across a gap as long as a step says nothing about that step."""


def _work_per_step(
    metas: Mapping[int, WorkerMeta], ranks: np.ndarray, width: int, step_ms: float
) -> np.ndarray | None:
    out = np.full((len(ranks), width), np.nan)
    for i, rank in enumerate(ranks.tolist()):
        usage = metas[int(rank)].host_usage
        if usage is None:
            return None
        gap = usage.sample_gap_p95_ms  # absent in captures that predate it: judged
        if not usage.exact_steps and gap is not None and gap > MAX_SAMPLE_GAP * step_ms:
            return None
        values = usage.main_run_ms[:width]
        out[i, : len(values)] = values
    return out


def imbalance_findings(
    metas: Mapping[int, WorkerMeta], features: Features, groups: PeerGroups, fusion: Fusion
) -> list[Reported]:
    width = features.steps.durations_ms.shape[1]
    step_ms = float(np.nanmedian(features.steps.durations_ms)) if features.ranks.size else 0.0
    work = _work_per_step(metas, features.ranks, width, step_ms)
    if work is None:
        return []
    named = {w.position for w in fusion.slow}
    out = []
    for group in range(len(groups.names)):
        members = np.array([m for m in groups.members(group).tolist() if m not in named])
        if len(members) < MIN_GROUP:
            continue
        if len(members) > MAX_RANKS:
            members = members[np.argsort(-np.nanmean(work[members], axis=1))[:MAX_RANKS]]
        dilation = _dilation(metas, features.ranks[members])
        found = _group_imbalance(
            work[members],
            features.steps.durations_ms[members],
            dilation,
            MIN_SHARED_HOST_SPREAD if _shared_cores(metas, features.ranks[members]) else 0.0,
        )
        if found is None:
            continue
        loss_ms, step_ms, shown, slowest = found
        cpu_loss_ms = loss_ms / dilation
        ranks = features.ranks[members]
        counts = np.bincount(slowest, minlength=len(members))
        top = ranks[np.argsort(-counts)[: min(8, len(members))]]
        top = [int(r) for r, c in zip(top, np.sort(counts)[::-1], strict=False) if c > 0]
        spread = np.nanmax(work[members], axis=0) - np.nanmin(work[members], axis=0)
        severity = min(1.0, loss_ms / step_ms)
        message = (
            f"Work is spread unevenly across ranks {format_ranks(ranks.tolist())}: in each step "
            f"the slowest rank computes {ms(cpu_loss_ms)} longer than the median rank"
            + (
                f", {ms(loss_ms)} of wall time on a host where the ranks ran "
                f"{pct(1 / dilation)} of their runnable time"
                if dilation > 1.05
                else ""
            )
            + f" ({pct(severity)} of the {ms(step_ms)} step, in {shown}/{len(slowest)} steps), "
            f"and the others wait for it; which rank is slowest changes from step to step "
            f"(most often {', '.join(map(str, top[:4]))}), so no single rank is at fault. "
            f"Spread of the training threads' CPU time per step: {ms(float(np.nanmedian(spread)))}"
            " (median). Next: balance the work per rank (bucket or pack inputs by length, "
            "sort batches by size, cap sequence lengths)."
        )
        finding = Finding(
            kind="imbalance",
            category="python",
            function=None,
            ranks=top,
            severity=round(severity, 4),
            evidence={
                "group_ranks": format_ranks(ranks.tolist()),
                "loss_ms_per_step": round(loss_ms, 3),
                "cpu_loss_ms_per_step": round(cpu_loss_ms, 3),
                "dilation": round(dilation, 3),
                "step_ms": round(step_ms, 3),
                "steps_shown": shown,
                "steps": len(slowest),
                "slowest_rank_per_step": [int(ranks[s]) for s in slowest.tolist()],
                "spread_ms_per_step": [round(float(x), 3) for x in spread.tolist()],
                "basis": "training-thread CPU time per step (run-queue wait excluded)",
            },
            message=message,
        )
        headline = (
            f"Load imbalance: in each step the slowest rank computes {ms(loss_ms)} longer than "
            f"the median one ({pct(severity)} of the step), a different rank in different steps"
        )
        out.append(Reported(finding=finding, headline=headline + "."))
    return out


def _dilation(metas: Mapping[int, WorkerMeta], ranks: np.ndarray) -> float:
    """What a ms of computation costs in wall time on the group's hosts: 1 / the median share
    of their runnable time the ranks' training threads ran (at most 4; 1 without samples).
    On a busy host the slowest rank's extra work keeps the others waiting that much longer."""
    shares = []
    for rank in ranks.tolist():
        usage = metas[int(rank)].host_usage
        if usage is None:
            return 1.0
        run = float(np.mean(usage.main_run_ms)) if usage.main_run_ms else 0.0
        wait = float(np.mean(outside_communication(usage))) if usage.main_wait_ms else 0.0
        if run + wait > 0:
            shares.append(run / (run + wait))
    if not shares:
        return 1.0
    return 1.0 / min(max(float(np.median(shares)), 0.25), 1.0)


def _shared_cores(metas: Mapping[int, WorkerMeta], ranks: np.ndarray) -> bool:
    """Whether any of the ranks' hosts had more runnable threads than cores."""
    for rank in ranks.tolist():
        usage = metas[int(rank)].host_usage
        if usage is None or usage.host_runnable is None or not usage.host_cores:
            continue
        if usage.host_runnable > usage.host_cores:
            return True
    return False


def _group_imbalance(
    work: np.ndarray, durations: np.ndarray, dilation: float = 1.0, min_spread: float = 0.0
) -> tuple[float, float, int, np.ndarray] | None:
    """`min_spread`: the least mean relative excess of each step's slowest rank's work over
    the median rank's."""
    valid = ~np.isnan(work).any(axis=0) & ~np.isnan(durations).any(axis=0)
    if valid.sum() < 3:
        return None
    work, durations = work[:, valid], durations[:, valid]
    median = np.median(work, axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        relative = np.where(median > 0, (np.max(work, axis=0) - median) / median, 0.0)
    if float(np.mean(relative)) < min_spread:
        return None
    loss = (np.max(work, axis=0) - median) * dilation
    step = np.median(durations, axis=0)
    step_ms = float(np.mean(step))
    loss_ms = float(np.mean(loss))
    if step_ms <= 0 or loss_ms < MIN_LOSS * step_ms:
        return None
    shown = int(np.sum(loss >= 0.5 * MIN_LOSS * step))
    if shown < MIN_STEPS_SHOWN * len(loss):
        return None
    slowest = np.argmax(work, axis=0)
    if np.bincount(slowest).max() > MAX_SLOWEST_SHARE * len(slowest):
        return None
    return loss_ms, step_ms, shown, slowest
