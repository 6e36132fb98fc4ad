"""Hardware vs software for GPU kernels without clock samples (docs/design.md §4 "Root cause").

A GPU that runs slower (clock throttling, a power cap, a degraded part) makes *every* kernel
slower by about the same factor at unchanged counts; a workload difference (longer sequences,
an extra op) changes some kernels, or their counts. So, per rank, each kernel function's
median duration is compared with its peers' median duration of the same function, and the
median of those ratios (each kernel function that matters counts once) is the rank's
*kernel speed* relative to its peers. When it
is lower than the peers' by ≥ `hardware_min_deviation` with robust z ≥ `min_robust_z`, and
the slowdown is uniform (most kernel functions are slowed by at least half that much), the
rank's GPU is the cause: a ResourceAnomaly with resource `gpu_kernel_speed` (1.0 = its peers),
category `gpu_hardware`. SM clock samples, when present, are the direct measure
(analyzer/signals/hardware.py); this rule needs only the trace.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfdiag.analyzer.compare.features import Features
from perfdiag.analyzer.compare.peers import PeerGroups
from perfdiag.analyzer.compare.stats import peer_reference, robust_scale
from perfdiag.analyzer.findings.fusion import Fusion
from perfdiag.analyzer.findings.reported import Reported
from perfdiag.analyzer.signals.hardware import ResourceAnomaly
from perfdiag.analyzer.text import NEXT_STEP, ms, pct
from perfdiag.api.schema import OTHER_FUNCTION
from perfdiag.api.thresholds import Thresholds
from perfdiag.api.verdict import Finding

RESOURCE = "gpu_kernel_speed"
UNIFORM_SHARE = 0.7
"""Share of the rank's kernel functions that must be slowed for the slowdown to be uniform."""
MIN_TIME_SHARE = 0.01
"""Kernel functions under this share of a rank's kernel time are not judged."""
MIN_KERNELS = 3
"""Uniformity needs at least this many kernel functions to compare."""
MAX_COUNT_CHANGE = 0.05
"""Kernels whose count differs from the peers' by more than this are workload, not speed."""


def kernel_speed_anomalies(
    summary: pa.Table, features: Features, groups: PeerGroups, thresholds: Thresholds
) -> list[ResourceAnomaly]:
    kernels = summary.filter(
        pc.and_(
            pc.equal(summary.column("category"), "gpu_compute"),
            pc.and_(
                pc.is_valid(summary.column("dur_median_us")),
                pc.not_equal(summary.column("function"), OTHER_FUNCTION),
            ),
        )
    )
    if kernels.num_rows == 0 or len(features.ranks) < 3:
        return []
    encoded = pc.dictionary_encode(kernels.column("function")).combine_chunks()
    fn = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    names: list[str] = encoded.dictionary.to_pylist()
    rank = kernels.column("rank").to_numpy().astype(np.int64)
    known = np.isin(rank, features.ranks)
    pos = np.searchsorted(features.ranks, rank[known])
    fn = fn[known]
    shape = (len(features.ranks), len(names))
    dur = np.full(shape, np.nan)
    count = np.full(shape, np.nan)
    time = np.zeros(shape)
    dur[pos, fn] = kernels.column("dur_median_us").to_numpy(zero_copy_only=False)[known]
    count[pos, fn] = kernels.column("count").to_numpy(zero_copy_only=False)[known]
    time[pos, fn] = kernels.column("time_ms").to_numpy(zero_copy_only=False)[known]

    found = []
    for group in range(len(groups.names)):
        members = groups.members(group)
        if len(members) < 3:
            continue
        sub_dur, sub_count, sub_time = dur[members], count[members], time[members]
        common = ~np.isnan(sub_dur).any(axis=0)  # kernels every peer runs
        if not common.any():
            continue
        ref_dur = peer_reference(sub_dur[:, common]).median
        ref_count = peer_reference(sub_count[:, common]).median
        ratio = sub_dur[:, common] / ref_dur
        same_count = np.abs(sub_count[:, common] / ref_count - 1.0) <= MAX_COUNT_CHANGE
        # Each kernel function that matters (≥ MIN_TIME_SHARE of the rank's kernel time) counts
        # once: one dominant kernel doing more work must not look like a slower GPU.
        share = sub_time[:, common] / np.maximum(
            sub_time[:, common].sum(axis=1, keepdims=True), 1e-12
        )
        weight = (same_count & (share >= MIN_TIME_SHARE)).astype(np.float64)
        if weight.sum(axis=1).min() < MIN_KERNELS:
            continue
        speed = 1.0 / _weighted_median(ratio, weight)  # (M,) 1.0 = like the peers
        stats = peer_reference(speed[:, None])
        scale = robust_scale(
            stats, noise_floor=thresholds.hardware_min_deviation / 3, absolute_floor=np.zeros(1)
        )[:, 0]
        ref = stats.median[:, 0]
        deviation = speed / ref - 1.0
        z = (ref - speed) / scale
        slowed = ratio >= 1.0 + thresholds.hardware_min_deviation / 2
        total = weight.sum(axis=1)
        uniform = np.divide(
            (weight * slowed).sum(axis=1), total, out=np.zeros(len(total)), where=total > 0
        )
        abnormal = (
            (-deviation >= thresholds.hardware_min_deviation)
            & (z >= thresholds.min_robust_z)
            & (uniform >= UNIFORM_SHARE)
        )
        common_names = [n for n, c in zip(names, common, strict=True) if c]
        for j in np.flatnonzero(abnormal).tolist():
            excess = sub_time[j, common] - np.nanmedian(sub_time[:, common], axis=0)
            top = int(np.argmax(excess))
            found.append(
                ResourceAnomaly(
                    rank=int(features.ranks[members[j]]),
                    function=common_names[top],
                    category="gpu_compute",
                    resource=RESOURCE,
                    hardware_category="gpu_hardware",
                    mu=float(speed[j]),
                    peers_mu=float(ref[j]),
                    sigma=None,
                    peers_sigma=None,
                    deviation=float(deviation[j]),
                    unstable=False,
                )
            )
    return found


def _weighted_median(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Row-wise weighted median (rows without weight: 1.0)."""
    order = np.argsort(values, axis=1)
    v = np.take_along_axis(values, order, axis=1)
    w = np.take_along_axis(weights, order, axis=1)
    cum = np.cumsum(w, axis=1)
    total = cum[:, -1:]
    idx = np.argmax(cum >= 0.5 * total, axis=1)
    out = v[np.arange(len(v)), idx]
    return np.where(total[:, 0] > 0, out, 1.0)


def kernel_speed_findings(
    anomalies: list[ResourceAnomaly], features: Features, fusion: Fusion
) -> list[Reported]:
    """A `hardware` finding per slowed GPU, unless a slow_worker finding already carries it.
    Severity: the rank's whole GPU-compute excess over its peers' median per step."""
    attributed = {w.rank for w in fusion.slow if w.hardware is not None}
    k = features.index_of("gpu_compute")
    out = []
    for anomaly in anomalies:
        if anomaly.rank in attributed or k is None:
            continue
        pos = int(np.searchsorted(features.ranks, anomaly.rank))
        others = np.delete(features.ms[:, k], pos)
        excess = float(features.ms[pos, k] - np.median(others)) if len(others) else 0.0
        step = float(features.mean_step_ms[pos])
        severity = float(np.clip(excess / step, 0.0, 1.0)) if step else 0.0
        slower = 1.0 / anomaly.mu - 1.0 if anomaly.mu > 0 else float("inf")
        message = (
            f"Rank {anomaly.rank}'s GPU kernels all run {pct(slower)} longer than the same "
            f"kernels on its peers, at the same counts (kernel speed {anomaly.mu:.2f} vs "
            f"{anomaly.peers_mu:.2f}): the GPU, not the code, costs {ms(max(excess, 0.0))}/step "
            f"({pct(severity)} of the {ms(step)} step). Next: {NEXT_STEP['gpu_hardware']}."
        )
        finding = Finding(
            kind="hardware",
            category="gpu_hardware",
            function=anomaly.function,
            ranks=[anomaly.rank],
            severity=round(severity, 4),
            evidence={
                "resource": anomaly.resource,
                "mu": round(anomaly.mu, 4),
                "peers_median_mu": round(anomaly.peers_mu, 4),
                "deviation": round(anomaly.deviation, 4),
                "gpu_compute_excess_ms_per_step": round(excess, 3),
                "top_kernel": anomaly.function,
                "basis": "every kernel slower by the same factor at unchanged counts",
            },
            message=message,
        )
        headline = (
            f"Rank {anomaly.rank}'s GPU is slow: every kernel runs {pct(slower)} longer than on "
            f"its peers (hardware)"
        )
        out.append(Reported(finding=finding, headline=headline + "."))
    return out
