"""Root cause from the governing resource (docs/design.md §4 "Root cause").

A summary row may carry the mean μ and standard deviation σ of the resource that governs its
function (SM clock for kernels, achieved bandwidth for collectives, CPU for Python). When a
rank's μ deviates from its peers' (lower clock, lower bandwidth) or its σ is unusually large
(throttling, a flapping link), the cause is the hardware, not the code: abnormal β with normal μ
is software or workload. The agent fills μ/σ from the hardware samples taken inside each
function's executions (perfdiag/engine/hardware_samples.py).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfdiag.analyzer.compare.features import Features
from perfdiag.analyzer.compare.peers import PeerGroups
from perfdiag.analyzer.compare.stats import peer_reference, robust_scale
from perfdiag.analyzer.text import short
from perfdiag.api.thresholds import Thresholds

# Resource name fragments → (finding category, True when lower values are worse).
_RESOURCE_RULES: tuple[tuple[str, str, bool], ...] = (
    ("sm_clock", "gpu_hardware", True),
    ("gpu", "gpu_hardware", True),
    ("bandwidth", "network", True),
    ("bus", "network", True),
    ("net", "network", True),
    ("link", "network", True),
    ("cpu", "host", True),
)
HEALTHY_PEER_FLOOR = {"cpu_run_fraction": 0.9}
"""A resource that is only judged when the peers' μ reaches this: the CPU share a rank's thread
gets while runnable is a noisy-neighbour signal only when its peers do get a CPU (on a host
oversubscribed by the job itself every rank waits alike, and the differences are noise)."""
SIGMA_RATIO = 2.0
"""σ/μ this many times the peers' (and above the deviation threshold) is an unstable resource."""


def resource_category(resource: str) -> tuple[str, bool]:
    lowered = resource.lower()
    for fragment, category, lower_is_worse in _RESOURCE_RULES:
        if fragment in lowered:
            return category, lower_is_worse
    return "host", True


@dataclass(frozen=True)
class ResourceAnomaly:
    rank: int
    function: str
    category: str
    """The function's taxonomy category."""
    resource: str
    hardware_category: str
    mu: float
    peers_mu: float
    sigma: float | None
    peers_sigma: float | None
    deviation: float
    """(μ − peers' μ) / peers' μ."""
    unstable: bool
    """σ/μ abnormally large (rather than, or besides, μ shifted)."""

    def describe(self) -> str:
        if self.unstable and abs(self.deviation) < 0.01:
            return f"{self.resource} unstable (σ {self.sigma:.3g} vs peers' {self.peers_sigma:.3g})"
        return (
            f"{self.resource} {self.mu:.4g} vs peers' {self.peers_mu:.4g} ({self.deviation:+.0%})"
        )


def resource_anomalies(
    summary: pa.Table, features: Features, groups: PeerGroups, thresholds: Thresholds
) -> list[ResourceAnomaly]:
    with_resource = summary.filter(
        pc.and_(pc.is_valid(summary.column("resource")), pc.is_valid(summary.column("resource_mu")))
    )
    if with_resource.num_rows == 0:
        return []
    key = pc.binary_join_element_wise(
        with_resource.column("resource"),
        with_resource.column("category"),
        with_resource.column("function"),
        "\x1f",
    )
    encoded = pc.dictionary_encode(key).combine_chunks()
    codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    keys: list[str] = encoded.dictionary.to_pylist()
    pos = np.searchsorted(features.ranks, with_resource.column("rank").to_numpy().astype(np.int64))
    n_ranks = len(features.ranks)
    mu = np.full((n_ranks, len(keys)), np.nan)
    sigma = np.full((n_ranks, len(keys)), np.nan)
    mu[pos, codes] = with_resource.column("resource_mu").to_numpy(zero_copy_only=False)
    sigma[pos, codes] = with_resource.column("resource_sigma").to_numpy(zero_copy_only=False)
    lower_worse = np.array([resource_category(k.split("\x1f", 1)[0])[1] for k in keys])
    floor = np.array([HEALTHY_PEER_FLOOR.get(k.split("\x1f", 1)[0], 0.0) for k in keys])

    found: list[ResourceAnomaly] = []
    for group in range(len(groups.names)):
        members = groups.members(group)
        sub_mu = mu[members]
        present = ~np.isnan(sub_mu)
        # Ranks without the function are not peers for its resource: compare present ones.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns: absent here
            present_median = np.nanmedian(np.where(present, sub_mu, np.nan), axis=0)
            peers_cv = np.nanmedian(
                np.where(present, sigma[members] / np.abs(sub_mu), np.nan), axis=0
            )
        filled = np.where(present, sub_mu, present_median)
        stats = peer_reference(np.nan_to_num(filled))
        scale = robust_scale(
            stats, noise_floor=thresholds.hardware_min_deviation / 3, absolute_floor=np.zeros(1)
        )
        with np.errstate(invalid="ignore", divide="ignore"):
            deviation = (sub_mu - stats.median) / stats.median
            z = (sub_mu - stats.median) / scale
            cv = sigma[members] / np.abs(sub_mu)
        worse = np.where(lower_worse, -1.0, 1.0)
        shifted = (deviation * worse >= thresholds.hardware_min_deviation) & (
            z * worse >= thresholds.min_robust_z
        )
        unstable = (cv >= thresholds.hardware_min_deviation) & (cv >= SIGMA_RATIO * peers_cv)
        abnormal = present & (shifted | unstable) & (stats.median > 0) & (stats.median >= floor)
        for i, k in zip(*np.nonzero(abnormal), strict=True):
            resource, category, function = keys[int(k)].split("\x1f", 2)
            peer_sigma = stats.median[i, k] * peers_cv[k]
            found.append(
                ResourceAnomaly(
                    rank=int(features.ranks[members[i]]),
                    function=function,
                    category=category,
                    resource=resource,
                    hardware_category=resource_category(resource)[0],
                    mu=float(sub_mu[i, k]),
                    peers_mu=float(stats.median[i, k]),
                    sigma=None if np.isnan(sigma[members[i], k]) else float(sigma[members[i], k]),
                    peers_sigma=None if np.isnan(peer_sigma) else float(peer_sigma),
                    deviation=float(deviation[i, k]),
                    unstable=bool(unstable[i, k]),
                )
            )
    return found


HOST_WIDE_RESOURCES = frozenset({"net_bytes_per_s"})
"""Resources read from the host, not the rank: NIC byte counters (/proc/net/dev)."""


def without_shared_host_resources(
    anomalies: list[ResourceAnomaly], hosts: dict[int, str | None]
) -> tuple[list[ResourceAnomaly], list[str]]:
    """The anomalies less those of a host-wide resource on a host that runs several ranks: a
    NIC every rank of the host shares (and bytes that are not the job's) cannot single out one
    of them. Each dropped one leaves a note."""
    per_host: dict[str, int] = {}
    for host in hosts.values():
        if host is not None:
            per_host[host] = per_host.get(host, 0) + 1
    kept, notes = [], []
    for anomaly in anomalies:
        host = hosts.get(anomaly.rank)
        if anomaly.resource in HOST_WIDE_RESOURCES and (host is None or per_host[host] > 1):
            where = f"host {host}" if host else "an unnamed host"
            notes.append(
                f"rank {anomaly.rank}: {anomaly.describe()} in {short(anomaly.function)}, but {where} "
                "runs several ranks that share its NIC counters: not attributed to the rank"
            )
            continue
        kept.append(anomaly)
    return kept, notes
