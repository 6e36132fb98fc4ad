"""CPU contention inside the job's own host: excess that is waiting for a core, not work.

When a host runs more busy threads than it has cores (several ranks per host on a small VM,
data-loader workers, a sidecar), the kernel time-slices them and whichever rank happens to
wait longer on the run queue looks slower, for a few hundred milliseconds at a time: long
enough to persist across a short window. The hardware sampler records each rank's run and
run-queue wait time (/proc/<pid>/schedstat), and the agent turns them into the share of each
host function's runnable time that the thread actually ran (`cpu_run_fraction`, analyzer/
hardware_samples.py). From it, the time each rank spent waiting for a CPU during its work.

A suspected slow worker whose excess over its peers is (all but an immaterial remainder)
extra run-queue wait, on a host where the peers wait too (their run share is below
HEALTHY_PEER_FLOOR), is not slow through its own code: the finding would name a random rank.
It is reported as a note instead. When the peers do get a CPU and only this rank does not,
that is a noisy neighbour and analyzer/signals/hardware.py attributes it to the host (`host`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from perfdiag.analyzer.compare.features import Features, waiting_rows
from perfdiag.analyzer.compare.peers import PeerGroups
from perfdiag.analyzer.signals.cpu_cause import peer_median
from perfdiag.analyzer.signals.hardware import HEALTHY_PEER_FLOOR, ResourceAnomaly
from perfdiag.analyzer.text import short

CPU_RESOURCE = "cpu_run_fraction"


@dataclass(frozen=True)
class CpuWait:
    wait_ms: NDArray[np.float64]
    """(R,) ms per step each rank's host work spent runnable but not running (0 if unknown)."""
    run_share: NDArray[np.float64]
    """(R,) share of that work's runnable time the rank ran (NaN where no samples say)."""


@dataclass(frozen=True)
class Contended:
    """A rank whose excess is explained by waiting for a CPU on an oversubscribed host."""

    rank: int
    step_ms: float
    excess_ms: float
    extra_wait_ms: float
    run_share: float
    peers_run_share: float

    def describe(self) -> str:
        return (
            f"rank {self.rank} spent {self.excess_ms:.2f} ms/step more than its peers outside "
            f"communication, {self.extra_wait_ms:.2f} ms of it waiting for a CPU (run queue): "
            f"it ran {self.run_share:.0%} of its runnable time, its peers {self.peers_run_share:.0%}."
            " The host runs more busy threads than it has cores, so which rank waits longest is "
            "chance; no rank is named. Fewer ranks per host (or fewer threads per rank) removes it."
        )


def cpu_wait(summary: pa.Table, features: Features) -> CpuWait | None:
    """Per-rank run-queue wait of the work outside communication, from the rows that carry a
    `cpu_run_fraction` μ; None when no row does (no host samples)."""
    mask = pc.fill_null(pc.equal(summary.column("resource"), CPU_RESOURCE), False)
    rows = summary.filter(mask)
    if rows.num_rows:
        rows = rows.filter(pa.array(~waiting_rows(rows)))
    n_ranks = len(features.ranks)
    if rows.num_rows == 0 or n_ranks == 0:
        return None
    rank_of_row = rows.column("rank").to_numpy().astype(np.int64)
    position = np.clip(np.searchsorted(features.ranks, rank_of_row), 0, max(n_ranks - 1, 0))
    known = features.ranks[position] == rank_of_row
    steps = np.maximum(features.steps.counts, 1)[position]
    ms = np.nan_to_num(rows.column("time_ms").to_numpy(zero_copy_only=False)) / steps
    share = np.clip(
        np.nan_to_num(rows.column("resource_mu").to_numpy(zero_copy_only=False), nan=1.0), 0, 1
    )
    wait = np.zeros(n_ranks)
    ran = np.zeros(n_ranks)
    total = np.zeros(n_ranks)
    np.add.at(wait, position[known], (ms * (1.0 - share))[known])
    np.add.at(ran, position[known], (ms * share)[known])
    np.add.at(total, position[known], ms[known])
    with np.errstate(invalid="ignore", divide="ignore"):
        run_share = np.where(total > 0, ran / total, np.nan)
    return CpuWait(wait_ms=wait, run_share=run_share)


def _peers_run_share(cpu: CpuWait, peers: NDArray[np.int64]) -> float:
    return peer_median(cpu.run_share, peers)


def _oversubscribed(peers_share: float) -> bool:
    """The peers themselves wait for a CPU: the host has more busy threads than cores."""
    return bool(np.isfinite(peers_share) and peers_share < HEALTHY_PEER_FLOOR[CPU_RESOURCE])


def without_chance_cpu_anomalies(
    anomalies: list[ResourceAnomaly],
    cpu: CpuWait | None,
    features: Features,
    groups: PeerGroups,
    host_load: NDArray[np.float64] | None = None,
) -> tuple[list[ResourceAnomaly], list[str]]:
    """The anomalies less the `cpu_run_fraction` ones of ranks whose peers wait for a CPU too,
    or whose host has more runnable threads than cores (`host_load`, per rank): one function's
    share differing on an oversubscribed host is chance. A note each."""
    if cpu is None:
        return anomalies, []
    kept: list[ResourceAnomaly] = []
    dropped: dict[int, tuple[list[ResourceAnomaly], float]] = {}
    for anomaly in anomalies:
        if anomaly.resource == CPU_RESOURCE:
            position = int(np.searchsorted(features.ranks, anomaly.rank))
            peers = groups.members(int(groups.labels[position]))
            share = _peers_run_share(cpu, peers[peers != position])
            busy = host_load is not None and bool(host_load[position] > 1.0)
            if _oversubscribed(share) or busy:
                dropped.setdefault(anomaly.rank, ([], share))[0].append(anomaly)
                continue
        kept.append(anomaly)
    notes = []
    for rank, (chance, share) in sorted(dropped.items()):
        worst = min(chance, key=lambda a: a.deviation)
        more = f" and {len(chance) - 1} other function(s)" if len(chance) > 1 else ""
        notes.append(
            f"rank {rank}: {worst.describe()} in {short(worst.function)}{more}, but it runs on an "
            f"oversubscribed host (its peers get a CPU {share:.0%} of the time they are "
            "runnable): not attributed to the hardware"
        )
    return kept, notes


def explained_by_contention(
    cpu: CpuWait,
    position: int,
    peers: NDArray[np.int64],
    rank: int,
    step_ms: float,
    excess_ms: float,
    min_excess_fraction: float,
) -> Contended | None:
    """The Contended record when `excess_ms` is extra run-queue wait on a host where the peers
    wait too, leaving less than the materiality threshold of the rank's own work."""
    peers = peers[peers != position]
    if not len(peers) or np.isnan(cpu.run_share[position]):
        return None
    peers_share = _peers_run_share(cpu, peers)
    if not _oversubscribed(peers_share):
        return None  # the peers get a CPU: a noisy neighbour, judged as hardware
    extra_wait = float(cpu.wait_ms[position] - np.median(cpu.wait_ms[peers]))
    if excess_ms - max(extra_wait, 0.0) >= min_excess_fraction * step_ms:
        return None  # the rank also does more work than its peers
    return Contended(
        rank=rank,
        step_ms=step_ms,
        excess_ms=excess_ms,
        extra_wait_ms=extra_wait,
        run_share=float(cpu.run_share[position]),
        peers_run_share=peers_share,
    )
