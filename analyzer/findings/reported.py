"""Findings of the verdict (docs/design.md §3), each with a message a person can act on.

Severity is the estimated fraction of step time lost (excess over peers / step time) and is
the only ordering key; a one-sentence `headline` per finding feeds the verdict's summary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from perfdiag.analyzer.compare.features import (
    Features,
    finding_category,
    is_idle,
    is_named_function,
)
from perfdiag.analyzer.compare.peers import PeerGroups
from perfdiag.analyzer.findings.fusion import Fusion
from perfdiag.analyzer.findings.kernel_growth import GPU_CATEGORIES, KernelGrowth, grown_kernels
from perfdiag.analyzer.findings.rules import RangeViolation
from perfdiag.analyzer.findings.slow_worker import Contributor, SlowWorker
from perfdiag.analyzer.load.workers import WorkerAccount
from perfdiag.analyzer.signals.hardware import ResourceAnomaly
from perfdiag.analyzer.text import (
    NEXT_STEP,
    RANGE_NEXT_STEP,
    cuda_call_kind,
    format_ranks,
    ms,
    next_step,
    pct,
    ranks_phrase,
    short,
    waits,
    what,
    what_inline,
)
from perfdiag.api.thresholds import Thresholds
from perfdiag.api.verdict import Finding

MAX_WORKERS_IN_EVIDENCE = 20
MAX_RANKS_IN_EVIDENCE = 256


@dataclass(frozen=True)
class Reported:
    finding: Finding
    headline: str


def _steps_phrase(outlying: int, steps: int) -> str:
    if outlying < 0:
        return f"persistence not judged ({steps} step{'s' if steps != 1 else ''})"
    return f"in {outlying}/{steps} steps"


def _peer_group(groups: PeerGroups, group: int, features: Features) -> dict[str, Any]:
    members = features.ranks[groups.members(group)]
    return {
        "name": groups.names[group],
        "ranks": format_ranks(members.tolist()),
        "size": len(members),
        "basis": groups.basis,
    }


def slow_worker_findings(
    fusion: Fusion,
    features: Features,
    groups: PeerGroups,
    thresholds: Thresholds,
    kernels: dict[int, list[KernelGrowth]] | None = None,
) -> list[Reported]:
    """One slow_worker per cause (workers with the same top contributor fuse), plus a
    function_anomaly when a single function carries most of a worker's excess. `kernels`: the
    grown kernels of each rank named for GPU work (analyzer/findings/kernel_growth.py)."""
    by_cause: dict[tuple[str | None, str], list[SlowWorker]] = {}
    for worker in sorted(fusion.slow, key=lambda w: -w.severity):
        key = (worker.function, worker.root_category)
        by_cause.setdefault(key, []).append(worker)
    out: list[Reported] = []
    for (function, category), workers in by_cause.items():
        grown = (kernels or {}).get(workers[0].rank, [])
        out.append(_slow_worker_finding(workers, function, category, features, groups, grown))
        anomaly = _function_anomaly(workers, thresholds)
        if anomaly is not None:
            out.append(anomaly)
    return out


HOST_CAUSES = frozenset({"throttled", "starved", "threads"})
"""CPU causes that hold a rank back from outside its training thread's own work."""
HOST_NEXT_STEP = {
    "throttled": "its CPU quota throttles it: raise the container's CPU limit (resources.limits"
    ".cpu of the pod in Kubernetes, cpu.max of its cgroup), or request whole cores (Guaranteed "
    "QoS with the static CPU manager policy) so that its threads are not stopped each period",
    "starved": "other processes on its host take the CPUs it needs: look at what else runs "
    "there (top -H), pin the ranks to their own cores, or move the job off that host",
    "threads": "threads of its own process that are no part of training compete for its CPU "
    "and the GIL: look at its background threads (py-spy dump) and intra-op thread counts "
    "(torch.set_num_threads, OMP_NUM_THREADS)",
}


def kernels_of_gpu_culprits(
    fusion: Fusion, features: Features, groups: PeerGroups, summary: pa.Table
) -> dict[int, list[KernelGrowth]]:
    """The grown kernels of each rank named for GPU work, against its peer group."""
    steps = {int(r): int(c) for r, c in zip(features.ranks, features.steps.counts, strict=True)}
    out: dict[int, list[KernelGrowth]] = {}
    for worker in fusion.slow:
        if worker.root_category in GPU_CATEGORIES:
            peers = [int(features.ranks[p]) for p in groups.members(worker.group).tolist()]
            out[worker.rank] = grown_kernels(summary, worker.rank, peers, steps)
    return out


def _without_function(evidence: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in evidence.items() if k != "function"}


def _worker_evidence(worker: SlowWorker) -> dict[str, Any]:
    evidence: dict[str, Any] = {
        "rank": worker.rank,
        "step_ms": round(worker.step_ms, 3),
        "excess_ms_per_step": round(worker.excess_ms, 3),
        "non_communication_ms_per_step": round(worker.non_wait_ms, 3),
        "peers_median_non_communication_ms_per_step": round(worker.peers_non_wait_ms, 3),
        "steps_outlying": worker.steps_outlying if worker.steps_outlying >= 0 else None,
        "steps": worker.steps,
        "peers": worker.peer_count,
        "contributors": [c.evidence() for c in worker.contributors],
        "categories": [_without_function(c.evidence()) for c in worker.categories],
        "root_cause": {"category": worker.root_category, "basis": worker.root_basis},
        "intermittent": worker.intermittent,
    }
    if worker.user_function is not None:
        evidence["user_function"] = worker.user_function
        evidence["user_path"] = [*worker.user_callers, worker.user_function]
    if worker.cpu is not None:
        evidence["cpu"] = {"cause": worker.cpu.kind, **worker.cpu.evidence}
    if worker.hardware is not None:
        evidence["hardware"] = _anomaly_evidence(worker.hardware)
    if worker.victims is not None:
        evidence["victims"] = {
            "ranks": worker.victims.ranks[:MAX_RANKS_IN_EVIDENCE],
            "count": len(worker.victims.ranks),
            "wait_ms_per_step": round(worker.victims.wait_ms, 3),
            "waiting_in": worker.victims.function,
            "note": "these ranks show more communication time because they wait for this one",
        }
    return evidence


def _slow_worker_finding(
    workers: list[SlowWorker],
    function: str | None,
    category: str,
    features: Features,
    groups: PeerGroups,
    grown: list[KernelGrowth],
) -> Reported:
    lead = workers[0]
    ranks = sorted(w.rank for w in workers)
    top = lead.top
    assert top is not None
    if cuda_call_kind(top.function) is not None:
        # A CUDA allocator call or host synchronization (or the Python binding making it) is
        # host-side CUDA time, whatever frame the profiler charged it to.
        category = "cuda_runtime"
    contributors = ", ".join(
        f"{what(c.function, c.category)} +{ms(c.excess_ms)}/step" for c in lead.contributors[:3]
    )
    who = ranks_phrase(ranks, capital=True)
    verb = "spends" if len(ranks) == 1 else "spend"
    # The user's own function, when it is not the top contributor itself, and where the ranks
    # held up by this one wait: said in the message and in the headline.
    in_user_code = lead.user_function if lead.user_function != top.function else None
    victims = lead.victims
    waiting_in = ""
    if victims is not None:
        waiting_in = f" in {short(victims.function)}" if victims.function else " in communication"
    held_back = category == "host" and lead.cpu is not None and lead.cpu.kind in HOST_CAUSES
    if held_back:
        # The host's counters measure what it cost the rank, not its time outside
        # communication: both are said, each as what it is.
        message = (
            f"{who} lost {ms(lead.excess_ms)}/step to {'its' if len(ranks) == 1 else 'their'} "
            f"host ({pct(lead.severity)} of {_its(lead, ranks)} {ms(lead.step_ms)} "
            f"{_step_kind(lead)}); outside communication rank {lead.rank} spent "
            f"{ms(lead.non_wait_ms)}/step, its peers {ms(lead.peers_non_wait_ms)} (median)."
        )
    else:
        less_wait = features.cpu_wait is not None
        message = (
            f"{who} {verb} {_excess_phrase(lead, ranks, less_wait)}; top contributors: "
            f"{contributors}."
        )
    if in_user_code is not None:
        path = " → ".join([*lead.user_callers, in_user_code])
        message += f" In the user's code: {path}."
    if grown:
        message += f" Its GPU time grew in {'; '.join(k.describe() for k in grown)}."
    if lead.cpu is not None:
        message += f" CPU: {lead.cpu.sentence}."
    if victims is not None:
        message += (
            f" {ranks_phrase(victims.ranks, capital=True)} {waits(victims.ranks)} for it"
            f"{waiting_in}."
        )
    advice = HOST_NEXT_STEP.get(lead.cpu.kind) if lead.cpu is not None else None
    message += (
        f" Cause: {category} ({lead.root_basis}). "
        f"Next: {advice or next_step(category, top.function)}."
    )
    if held_back:
        headline = (
            f"{who} {'is' if len(ranks) == 1 else 'are'} slowing the job: {ms(lead.excess_ms)} "
            f"of {_its(lead, ranks)} {ms(lead.step_ms)} {_step_kind(lead)} "
            f"({pct(lead.severity)}) is lost to its host"
        )
    else:
        headline = (
            f"{who} {'is' if len(ranks) == 1 else 'are'} slowing the job: {ms(lead.excess_ms)} "
            f"of {_its(lead, ranks)} {ms(lead.step_ms)} {_step_kind(lead)} "
            f"({pct(lead.severity)}) is extra time its peers don't spend, mostly "
            f"{what_inline(top.function, top.category)} (+{ms(top.excess_ms)}/step, "
            f"{_category_word(top.category)})"
        )
    if lead.cause_function is not None:
        headline += f" around its calls of {short(lead.cause_function)}"
    elif in_user_code is not None:
        headline += f" in {in_user_code}"
    elif grown and grown[0].name != top.function:
        headline += f" in {short(grown[0].name)}"
    if lead.cpu is not None and lead.cpu.kind in (
        "blocked",
        "threads",
        "throttled",
        "starved",
        "device",
    ):
        headline += f" — {lead.cpu.sentence}"
    if lead.hardware is not None:
        headline += f", with {lead.hardware.describe()}: hardware"
    if victims is not None:
        headline += f"; {ranks_phrase(victims.ranks)} {waits(victims.ranks)} for it{waiting_in}"
    evidence = {
        "workers": [_worker_evidence(w) for w in workers[:MAX_WORKERS_IN_EVIDENCE]],
        "worker_count": len(workers),
        "peer_group": _peer_group(groups, lead.group, features),
    }
    if grown:
        evidence["kernels"] = [k.evidence() for k in grown]
    if not is_named_function(function) and grown:
        function = grown[0].name
    finding = Finding(
        kind="slow_worker",
        category=category,
        function=function if is_named_function(function) else None,
        ranks=ranks,
        severity=round(max(w.severity for w in workers), 4),
        evidence=evidence,
        message=message,
    )
    return Reported(finding=finding, headline=headline + ".")


def _function_anomaly(workers: list[SlowWorker], thresholds: Thresholds) -> Reported | None:
    lead = workers[0]
    top = lead.top
    if top is None or not is_named_function(top.function) or not top.outlying:
        return None
    if lead.cpu is not None and lead.cpu.kind in HOST_CAUSES:
        # Its functions ran slower because the host held the rank back: a symptom the
        # slow_worker finding already gives (its contributors), no anomaly of the function.
        return None
    if top.excess_ms < thresholds.dominant_function_share * lead.excess_ms:
        return None
    ranks = sorted(w.rank for w in workers)
    tops: list[Contributor] = [w.top for w in workers if w.top is not None]
    share = min(1.0, top.excess_ms / lead.excess_ms) if lead.excess_ms else 0.0
    message = (
        f"{what(top.function, top.category)} takes {ms(top.ms)}/step on "
        f"{ranks_phrase([lead.rank])} vs {ms(top.peers_ms)}/step on its peers (median; "
        f"{_ratio(top.ratio)}, robust z {_num(top.robust_z)}, "
        f"{_steps_phrase(top.steps_outlying, top.steps)}): +{ms(top.excess_ms)}/step, "
        f"{pct(share)} of the rank's excess."
    )
    if len(ranks) > 1:
        message += f" Same on {ranks_phrase([r for r in ranks if r != lead.rank])}."
    finding = Finding(
        kind="function_anomaly",
        category=finding_category(top.category),
        function=top.function,
        ranks=ranks,
        # A function cannot lose more time than its worker's whole excess.
        severity=round(
            max(
                min(w.severity, max(0.0, t.excess_ms / w.step_ms))
                for t, w in zip(tops, workers, strict=True)
            ),
            4,
        ),
        evidence={
            "per_rank": [
                {"rank": w.rank, **t.evidence()}
                for t, w in zip(tops[:MAX_WORKERS_IN_EVIDENCE], workers, strict=False)
            ]
        },
        message=message,
    )
    headline = f"{short(top.function)} takes {ms(top.excess_ms)}/step more on {ranks_phrase(ranks)}"
    return Reported(finding=finding, headline=headline + ".")


def _its(lead: SlowWorker, ranks: list[int]) -> str:
    return "its" if len(ranks) == 1 else f"rank {lead.rank}'s"


def _step_kind(lead: SlowWorker) -> str:
    """Which step time a severity is a share of: the mean of the window's steps, or the median
    one (a throttled rank's, when stalls of the whole host lengthen the mean)."""
    return "median step" if lead.step_ms < lead.mean_step_ms - 1e-9 else "mean step"


ACCOUNTED_TOLERANCE_MS = 0.05


def _excess_phrase(lead: SlowWorker, ranks: list[int], less_wait: bool) -> str:
    """The rank's excess with its time outside communication, each said as what it is: the
    excess may be counted from the functions that stand out, or by the CPU accounting (extra
    computation with the waits for a CPU it brings on a busy host), and the time outside
    communication has the ranks' waits for a CPU taken out where they were sampled."""
    own = lead.non_wait_ms - lead.peers_non_wait_ms
    share = (
        f"{pct(lead.severity)} of {_its(lead, ranks)} {ms(lead.step_ms)} {_step_kind(lead)}, "
        f"{_steps_phrase(lead.steps_outlying, lead.steps)}"
        f"{', intermittently' if lead.intermittent else ''}"
    )
    times = (
        f"rank {lead.rank} {ms(lead.non_wait_ms)} against its peers' "
        f"{ms(lead.peers_non_wait_ms)}, median{', less their waits for a CPU' if less_wait else ''}"
    )
    their = "its" if len(ranks) == 1 else "their"
    if lead.excess_basis == "total" or abs(own - lead.excess_ms) <= max(
        ACCOUNTED_TOLERANCE_MS, 0.005 * lead.excess_ms
    ):
        return f"{ms(lead.excess_ms)}/step more than {their} peers outside communication ({times}; {share})"
    if lead.excess_basis == "cpu":
        return (
            f"{ms(lead.excess_ms)}/step of extra work of {their} own: its extra computation by "
            f"the CPU accounting, with the waits for a CPU that it brings on this host ({share}); "
            f"outside communication, {times}"
        )
    return (
        f"{ms(lead.excess_ms)}/step more than {their} peers in the work that stands out from "
        f"theirs ({share}); outside communication in all, {times}"
    )


def _category_word(category: str) -> str:
    return "no profiled op: likely Python" if is_idle(category) else category


def _ratio(ratio: float) -> str:
    return "absent on peers" if not np.isfinite(ratio) else f"×{ratio:.1f}"


def _num(x: float) -> str:
    return "∞" if not np.isfinite(x) else f"{x:.1f}"


def _anomaly_evidence(anomaly: ResourceAnomaly) -> dict[str, Any]:
    return {
        "function": anomaly.function,
        "resource": anomaly.resource,
        "mu": anomaly.mu,
        "peers_median_mu": anomaly.peers_mu,
        "sigma": anomaly.sigma,
        "peers_sigma": anomaly.peers_sigma,
        "deviation": round(anomaly.deviation, 4),
        "unstable": anomaly.unstable,
    }


def communication_findings(fusion: Fusion) -> list[Reported]:
    out = []
    for outlier in fusion.communication:
        category = outlier.hardware.hardware_category if outlier.hardware else "communication"
        top = outlier.top_function
        function = top.function if top is not None and is_named_function(top.function) else None
        where = f", mostly in {short(function)}" if function else ""
        message = (
            f"Rank {outlier.rank} spends {ms(outlier.excess_ms)}/step more in communication than "
            f"its peers{where}, and its peers do not work longer to explain it "
            f"({ms(outlier.unexplained_ms)}/step unexplained): its collectives themselves are "
            f"slower. Next: {NEXT_STEP[category]}."
        )
        evidence: dict[str, Any] = {
            "communication": outlier.contributor.evidence(),
            "unexplained_ms_per_step": round(outlier.unexplained_ms, 3),
            "step_ms": round(outlier.step_ms, 3),
        }
        if top is not None:
            evidence["top_function"] = top.evidence()
        if outlier.hardware is not None:
            evidence["hardware"] = _anomaly_evidence(outlier.hardware)
        finding = Finding(
            kind="slow_worker",
            category=category,
            function=function,
            ranks=[outlier.rank],
            severity=round(outlier.severity, 4),
            evidence=evidence,
            message=message,
        )
        headline = (
            f"Rank {outlier.rank}'s communication is {ms(outlier.unexplained_ms)}/step slower "
            f"than its peers' with nothing else to explain it"
        )
        out.append(Reported(finding=finding, headline=headline + "."))
    return out


def hardware_findings(
    anomalies: list[ResourceAnomaly], features: Features, fusion: Fusion
) -> list[Reported]:
    """Every abnormal resource, with the time its function loses on that rank as severity."""
    out = []
    for anomaly in anomalies:
        pos = int(np.searchsorted(features.ranks, anomaly.rank))
        k = features.index_of(anomaly.category, anomaly.function)
        step = float(features.mean_step_ms[pos])
        excess = 0.0
        if k is not None:
            members = features.ms[:, k]
            others = np.delete(members, pos)
            excess = float(features.ms[pos, k] - np.median(others)) if len(others) else 0.0
        severity = float(np.clip(excess / step, 0.0, 1.0)) if step else 0.0
        message = (
            f"{anomaly.describe()} while running {short(anomaly.function)} ({anomaly.category}) on rank "
            f"{anomaly.rank}: the hardware, not the code, "
            f"{'costs ' + ms(excess) + '/step' if excess > 0 else 'deviates'}. "
            f"Next: {NEXT_STEP[anomaly.hardware_category]}."
        )
        finding = Finding(
            kind="hardware",
            category=anomaly.hardware_category,
            function=anomaly.function,
            ranks=[anomaly.rank],
            severity=round(severity, 4),
            evidence={**_anomaly_evidence(anomaly), "excess_ms_per_step": round(excess, 3)},
            message=message,
        )
        headline = f"Rank {anomaly.rank}: {anomaly.describe()} in {short(anomaly.function)}"
        out.append(Reported(finding=finding, headline=headline + "."))
    return out


def range_findings(violations: list[RangeViolation]) -> list[Reported]:
    out = []
    for v in violations:
        top = v.top_functions[0][0] if v.top_functions else None
        tops = ", ".join(f"{name} (β {beta:.3f})" for name, beta in v.top_functions[:3])
        share = (
            f"{len(v.ranks)} of {v.total_ranks} ranks"
            if len(v.ranks) < v.total_ranks
            else {1: "The rank", 2: "Both ranks"}.get(v.total_ranks, f"All {v.total_ranks} ranks")
        )
        spend = "spends" if share == "The rank" else "spend"
        message = (
            f"{share} {spend} {pct(v.median_beta)} of the window in {v.category} (median; expected "
            f"≤ {pct(v.bound)} for a {v.job_kind.upper()} job)"
            + (f"; top: {tops}" if tops else "")
            + (
                f"; {pct(v.discounted_beta)} of waiting explained by a slow worker was discounted"
                if v.discounted_beta > 0
                else ""
            )
            + f". Next: {RANGE_NEXT_STEP.get(v.category, '')}."
        )
        finding = Finding(
            kind="expected_range",
            category=v.category,
            function=top,
            ranks=v.ranks,
            severity=round(v.severity, 4),
            evidence={
                "bound_beta": v.bound,
                "job_kind": v.job_kind,
                "median_beta": round(v.median_beta, 4),
                "ranks_over": len(v.ranks),
                "ranks_total": v.total_ranks,
                "discounted_beta": round(v.discounted_beta, 4),
                "top_functions": [
                    {"function": name, "mean_beta": round(beta, 4)}
                    for name, beta in v.top_functions
                ],
            },
            message=message,
        )
        headline = (
            f"{share} {spend} {pct(v.median_beta)} of the time in {v.category} "
            f"(expected ≤ {pct(v.bound)})"
        )
        out.append(Reported(finding=finding, headline=headline + "."))
    return out


def hang_findings(account: WorkerAccount) -> list[Reported]:
    """One `hang` finding naming the ranks that hold the job up (analyzer/load/hang.py), with the
    divergent stack as evidence; the ranks waiting for them are in the evidence."""
    stuck = account.stuck
    diagnosis = account.hang
    if not stuck or diagnosis is None:
        return []
    workers = sorted(stuck.values(), key=lambda w: w.rank)
    longest = max(w.stalled_s for w in workers)
    steps = format_ranks(w.step for w in workers)
    culprits = diagnosis.culprits
    if culprits:
        ranks = [c.rank for c in culprits]
        lead = culprits[0]
        category = lead.category
        where = f" at {lead.location}" if lead.location else ""
        waiting = ""
        if diagnosis.waiting:
            waiting = (
                f"; {ranks_phrase(diagnosis.waiting)} {waits(diagnosis.waiting)} for it in "
                f"{diagnosis.waiting_in}"
                if len(ranks) == 1
                else f"; {ranks_phrase(diagnosis.waiting)} wait for them in {diagnosis.waiting_in}"
            )
        headline = (
            f"{ranks_phrase(ranks, capital=True)} {'is' if len(ranks) == 1 else 'are'} holding "
            f"up the job: stuck in {_hang_place(category)}{where}{waiting} (no step for "
            f"{longest:.0f} s)"
        )
        message = (
            f"{headline}. Why {'this rank' if len(ranks) == 1 else 'these ranks'}: "
            + "; ".join(f"rank {c.rank}: {c.reason}" for c in culprits[:MAX_WORKERS_IN_EVIDENCE])
            + f". Next: {HANG_NEXT_STEP.get(category, HANG_NEXT_STEP['python'])}."
        )
    else:
        ranks = [w.rank for w in workers]
        category = "communication"
        headline = (
            f"{ranks_phrase(ranks, capital=True)} {'is' if len(ranks) == 1 else 'are'} stuck at "
            f"step {steps} (no progress for {longest:.0f} s while alive)"
        )
        message = (
            f"{headline}; the stack dumps do not single out a rank ({diagnosis.basis}): "
            "every stuck rank waits in the same collective, so the rank holding it up may be "
            "outside this capture or stuck inside the collective library. Next: "
            f"{HANG_NEXT_STEP['communication']}."
        )
    evidence: dict[str, Any] = {
        "culprits": [
            {
                "rank": c.rank,
                "reason": c.reason,
                "category": c.category,
                "location": c.location,
                "stack": c.stack,
            }
            for c in culprits[:MAX_WORKERS_IN_EVIDENCE]
        ],
        "waiting": {
            "ranks": diagnosis.waiting[:MAX_RANKS_IN_EVIDENCE],
            "count": len(diagnosis.waiting),
            "collective": diagnosis.waiting_in,
            "stack": diagnosis.waiting_stack,
        },
        "stack_groups": diagnosis.groups[:MAX_WORKERS_IN_EVIDENCE],
        "workers": [
            {
                "rank": w.rank,
                "step": w.step,
                "stalled_s": round(w.stalled_s, 1),
                "phase": w.phase,
                "stack": w.stack,  # the main thread's innermost frames
            }
            for w in workers[:MAX_RANKS_IN_EVIDENCE]
        ],
        "basis": diagnosis.basis,
    }
    if diagnosis.flight_recorder:
        evidence["flight_recorder"] = diagnosis.flight_recorder[:MAX_WORKERS_IN_EVIDENCE]
    finding = Finding(
        kind="hang",
        category=category,
        function=culprits[0].location if culprits else None,
        ranks=ranks,
        severity=1.0,
        evidence=evidence,
        message=message,
    )
    return [Reported(finding=finding, headline=headline + ".")]


HANG_NEXT_STEP = {
    "dataloader": "look at the data loading code in the quoted frames (a stalled read, a dead "
    "worker process, a lock); py-spy dump --pid of the loader workers shows where they are",
    "communication": "compare the collectives each rank issued (a rank skipped or reordered "
    "one); NCCL/gloo debug logs (NCCL_DEBUG=INFO) and the Flight Recorder name the sequence "
    "number",
    "python": "the quoted frames show where the training thread waits; a lock, a queue, a "
    "blocking read or a condition that never becomes true on this rank",
}


def _hang_place(category: str) -> str:
    return {
        "dataloader": "its data loader",
        "communication": "a different collective",
        "python": "Python code outside any collective",
    }.get(category, category)
