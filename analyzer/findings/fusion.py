"""Slow-worker fusion: from per-feature outliers to culprits, victims and a root cause.

Victims vs culprit (data-parallel): the slow rank's peers wait for it in collectives, so they
show MORE communication time and the culprit LESS. A rank is therefore named only for time it
spends *outside* communication ("non-wait" time, idle included: uninstrumented work is still
work) in excess of its peers; ranks whose extra time is communication are its victims. A rank
that waits more than its peers is never a culprit here.

One round of fusion: the suspects (analyzer/findings/suspects.py), each judged by whether its
extra time is its own (analyzer/findings/naming.py), the ranks the host holds back, the victims
of those named, and the communication no culprit explains (analyzer/findings/comm_outliers.py).
Collectives matched across ranks (analyzer/compare/collectives.py: arrival order, wait vs
transfer) add the slow-link case and drop `communication_outliers` that turn out to be waiting.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
from numpy.typing import NDArray

from perfdiag.analyzer.compare.features import LEVEL_FUNCTION, Features, is_named_function
from perfdiag.analyzer.compare.outliers import Deviations
from perfdiag.analyzer.compare.peers import PeerGroups
from perfdiag.analyzer.findings.comm_outliers import (
    CommOutlier,
    communication_outliers,
    without_contended_communication,
)
from perfdiag.analyzer.findings.naming import NotNamed, name_suspect
from perfdiag.analyzer.findings.slow_worker import Contributor, SlowWorker, Victims
from perfdiag.analyzer.findings.suspects import (
    PeerContext,
    find_suspects,
    suspect_worker,
)
from perfdiag.analyzer.signals.contention import Contended, CpuWait
from perfdiag.analyzer.signals.cpu_cause import CpuCause, PeerCpu, RankCpu, held_back
from perfdiag.analyzer.signals.hardware import ResourceAnomaly
from perfdiag.analyzer.text import short
from perfdiag.api.thresholds import Thresholds

VICTIM_SHARE = 0.5
"""A peer is a victim when it waits at least this share of the culprit's excess longer."""


@dataclass(frozen=True)
class Fusion:
    slow: list[SlowWorker] = field(default_factory=list)
    communication: list[CommOutlier] = field(default_factory=list)
    contended: list[Contended] = field(default_factory=list)
    """Suspects whose excess is waiting for a CPU on an oversubscribed host (not named)."""
    contended_notes: list[str] = field(default_factory=list)


def fuse(
    features: Features,
    dev: Deviations,
    groups: PeerGroups,
    thresholds: Thresholds,
    anomalies: list[ResourceAnomaly],
    cpu: CpuWait | None = None,
    host: RankCpu | None = None,
    excluded: NDArray[np.bool_] | None = None,
) -> Fusion:
    """`host`: the ranks' CPU accounting, when every rank has it (else `cpu`, the older
    per-function run share, judges contention). `excluded`: the ranks named in an earlier
    round, which are no reference for their peers."""
    reference = np.ones(len(features.ranks), dtype=bool) if excluded is None else ~excluded
    context = PeerContext(features, dev, groups, thresholds, reference, host, cpu)
    by_rank: dict[int, list[ResourceAnomaly]] = {}
    for anomaly in anomalies:
        by_rank.setdefault(anomaly.rank, []).append(anomaly)
    slow: list[SlowWorker] = []
    contended: list[Contended] = []
    notes: list[str] = []
    for suspect in find_suspects(context):
        worker = suspect_worker(suspect)
        if worker is None:
            continue
        named = name_suspect(suspect, worker)
        if isinstance(named, NotNamed):
            notes.append(named.note)
        elif isinstance(named, Contended):
            contended.append(named)
        else:
            slow.append(_attributed(named, by_rank.get(named.rank, [])))
    if host is not None:
        slow += _held_back_workers(context, host, {w.position for w in slow})
    slow_positions = {w.position for w in slow}
    slow = [replace(w, victims=_victims(features, groups, w, slow_positions)) for w in slow]
    communication = communication_outliers(features, groups, dev, thresholds, slow, by_rank)
    if host is not None and host.oversubscribed:
        communication, host_notes = without_contended_communication(
            communication, features, groups, host
        )
        notes += host_notes
    return Fusion(
        slow=slow, communication=communication, contended=contended, contended_notes=notes
    )


def _attributed(worker: SlowWorker, anomalies: list[ResourceAnomaly]) -> SlowWorker:
    """Abnormal resource μ/σ behind a contributor → the cause is hardware (docs/design.md §4)."""
    for contributor in worker.contributors:
        for anomaly in anomalies:
            if (anomaly.function, anomaly.category) == (contributor.function, contributor.category):
                return replace(
                    worker,
                    hardware=anomaly,
                    root_category=anomaly.hardware_category,
                    root_basis=f"{anomaly.describe()} in {short(anomaly.function)}: "
                    "abnormal resource, not code",
                )
    return worker


def _held_back_workers(context: PeerContext, host: RankCpu, named: set[int]) -> list[SlowWorker]:
    """The ranks not named for their own time that the host held back (a CPU quota, a CPU
    taken by others), against their whole peer group."""
    features, groups, thresholds = context.features, context.groups, context.thresholds
    workers = []
    for i in range(len(features.ranks)):
        if i in named:
            continue
        against = PeerCpu.of(host, i, groups.members(int(groups.labels[i])), context.material_ms(i))
        # Throttled time is the cgroup's exact counter: a stall of the whole host inflates
        # the mean step, not the throttling, so it is weighed against the median step.
        typical_ms = thresholds.min_excess_fraction * float(features.steps.median_ms[i])
        cause = held_back(against, min(against.material_ms, typical_ms))
        if cause is not None:
            workers.append(_held_back_worker(context, i, cause))
    return workers


def _held_back_worker(context: PeerContext, i: int, cause: CpuCause) -> SlowWorker:
    """A rank the host held back: its excess is the time it waited for a CPU or was throttled.
    A throttled rank's share is of its typical (median) step when stalls of the whole host
    make the mean longer: the quota costs it that share of every step it runs."""
    features = context.features
    step = float(features.mean_step_ms[i])
    if cause.kind == "throttled" and cause.excess_ms <= float(features.steps.median_ms[i]):
        step = min(step, float(features.steps.median_ms[i]))
    # A counter of the host (throttled time, run-queue wait) can exceed the step it is read
    # over (a cgroup throttled across several CPUs at once): the rank cannot lose more than
    # its step. The counter itself stays in the cause's evidence.
    excess = min(cause.excess_ms, step)
    held = Contributor(
        function=None,
        category="host",
        ms=excess,
        peers_ms=0.0,
        best_peer_ms=0.0,
        excess_ms=excess,
        beta=excess / step if step else 0.0,
        peers_beta=0.0,
        robust_z=float("nan"),
        ratio=float("nan"),
        steps_outlying=-1,
        steps=int(features.steps.counts[i]),
        outlying=True,
    )
    return SlowWorker(
        **context.rank_times(i),
        step_ms=step,
        excess_ms=excess,
        steps_outlying=-1,
        steps=int(features.steps.counts[i]),
        contributors=[held],
        categories=[],
        root_category="host",
        root_basis=cause.sentence,
        cpu=cause,
    )


def _victims(
    features: Features, groups: PeerGroups, worker: SlowWorker, slow_positions: set[int]
) -> Victims | None:
    wait = features.wait_index
    members = groups.members(worker.group)
    members = members[~np.isin(members, list(slow_positions))]
    if not len(members):
        return None
    extra = features.ms[members, wait] - features.ms[worker.position, wait]
    chosen = members[extra >= VICTIM_SHARE * worker.excess_ms]
    if not len(chosen):
        return None
    comm_functions = np.flatnonzero((features.level == LEVEL_FUNCTION) & features.waiting)
    function = None
    if len(comm_functions):
        medians = np.median(features.ms[np.ix_(chosen, comm_functions)], axis=0)
        k = int(comm_functions[np.argmax(medians)])
        if is_named_function(features.functions[k]):
            function = features.functions[k]
    return Victims(
        ranks=sorted(int(r) for r in features.ranks[chosen]),
        wait_ms=float(np.median(extra[extra >= VICTIM_SHARE * worker.excess_ms])),
        function=function,
    )
