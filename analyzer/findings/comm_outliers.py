"""Ranks whose communication is slower than their peers' with nothing else to explain it (a
slow link, a collective only they run): what the fusion (analyzer/findings/fusion.py) leaves
of outlying communication once culprits, their victims and the peers' work are accounted for."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfdiag.analyzer.compare.features import LEVEL_FUNCTION, Features
from perfdiag.analyzer.compare.outliers import Deviations
from perfdiag.analyzer.compare.peers import PeerGroups
from perfdiag.analyzer.findings.slow_worker import Contributor, SlowWorker, contributor
from perfdiag.analyzer.signals.cpu_cause import RankCpu
from perfdiag.analyzer.signals.hardware import ResourceAnomaly
from perfdiag.api.taxonomy import COMMUNICATION
from perfdiag.api.thresholds import Thresholds


@dataclass(frozen=True)
class CommOutlier:
    """Communication excess on a rank that the peers' work does not explain."""

    rank: int
    step_ms: float
    excess_ms: float
    unexplained_ms: float
    contributor: Contributor
    top_function: Contributor | None
    hardware: ResourceAnomaly | None = None

    @property
    def severity(self) -> float:
        return (
            float(min(1.0, max(0.0, self.unexplained_ms / self.step_ms))) if self.step_ms else 0.0
        )


def communication_outliers(
    features: Features,
    groups: PeerGroups,
    dev: Deviations,
    thresholds: Thresholds,
    slow: list[SlowWorker],
    anomalies: dict[int, list[ResourceAnomaly]],
) -> list[CommOutlier]:
    """Ranks with outlying communication time that no culprit (`slow`) and no peer's work
    explains.

    In a synchronous collective every rank leaves at the same time, so extra communication on a
    rank normally means it arrived early — its peers work longer (the rank is a victim). What is
    left after subtracting that is the rank's own slowness in communication (a slow link, a
    collective only it runs).
    """
    comm, nw = features.wait_index, features.non_wait_index
    explained_by_culprit = {r for w in slow for r in (w.victims.ranks if w.victims else [])}
    outliers = []
    for i in np.flatnonzero(dev.outlying[:, comm]).tolist():
        rank = int(features.ranks[i])
        if rank in explained_by_culprit or any(w.position == i for w in slow):
            continue
        if len(groups.members(int(groups.labels[i]))) < 3:
            # Two ranks leave each collective together: one waiting longer means the other
            # arrived later, whether or not its profiled work shows why.
            continue
        peers_work_more = max(0.0, -float(dev.excess_ms[i, nw]))
        if features.cpu_wait is not None and features.non_wait_wall_ms is not None:
            # The peers' wall time outside communication, run-queue wait included: while a
            # peer waits for a CPU, this rank waits for that peer in the collective.
            wall = features.non_wait_wall_ms
            peers = groups.members(int(groups.labels[i]))
            peers = peers[peers != i]
            if len(peers):
                peers_work_more = max(peers_work_more, float(np.median(wall[peers]) - wall[i]))
        unexplained = float(dev.excess_ms[i, comm]) - peers_work_more
        step = float(features.mean_step_ms[i])
        if unexplained < thresholds.min_excess_fraction * step:
            continue
        comm_functions = np.flatnonzero((features.level == LEVEL_FUNCTION) & features.waiting)
        top = None
        if len(comm_functions):
            k = int(comm_functions[np.argmax(dev.excess_ms[i, comm_functions])])
            top = contributor(features, dev, i, k)
        hardware = next((a for a in anomalies.get(rank, []) if a.category == COMMUNICATION), None)
        outliers.append(
            CommOutlier(
                rank=rank,
                step_ms=step,
                excess_ms=float(dev.excess_ms[i, comm]),
                unexplained_ms=unexplained,
                contributor=contributor(features, dev, i, comm),
                top_function=top,
                hardware=hardware,
            )
        )
    return outliers


def without_contended_communication(
    outliers: list[CommOutlier], features: Features, groups: PeerGroups, host: RankCpu
) -> tuple[list[CommOutlier], list[str]]:
    """On an oversubscribed host a collective's threads wait for a CPU like any other: extra
    communication time that the rank's threads spent on the run queue is not a slower link.
    The outliers kept, and a note for each one left out."""
    kept, notes = [], []
    for outlier in outliers:
        i = int(np.searchsorted(features.ranks, outlier.rank))
        peers = groups.members(int(groups.labels[i]))
        peers = peers[peers != i]
        typical_wait = float(np.nanmedian(host.process_wait[peers]))
        extra_wait = float(host.process_wait[i]) - typical_wait
        if np.isfinite(extra_wait) and extra_wait >= 0.5 * outlier.unexplained_ms:
            notes.append(
                f"rank {outlier.rank}: {outlier.unexplained_ms:.1f} ms/step more in "
                f"communication than its peers, and its threads waited {extra_wait:.1f} ms/step "
                "longer for a CPU on an oversubscribed host: not a slower link; not named"
            )
            continue
        if np.isfinite(typical_wait) and outlier.unexplained_ms <= typical_wait:
            # Each collective ends when the last rank's threads get a CPU: a difference smaller
            # than what every rank's threads wait for one per step is the host, not a link.
            notes.append(
                f"rank {outlier.rank}: {outlier.unexplained_ms:.1f} ms/step more in "
                f"communication than its peers, less than the {typical_wait:.1f} ms/step each "
                "rank's threads wait for a CPU on this oversubscribed host: not named"
            )
            continue
        kept.append(outlier)
    return kept, notes
