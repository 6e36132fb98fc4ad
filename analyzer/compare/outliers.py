"""Peer comparison (docs/design.md §4 "Differential observability") over the feature matrices.

A (rank, feature) is *outlying* when its excess over the peers' median is
  material      — at least `min_excess_fraction` of the step time,
  statistically outlying — robust z ≥ `min_robust_z` and ratio to the peers' median ≥ `min_ratio`,
  persistent    — outlying in ≥ `min_persistence` of the window's steps.
All three are needed: materiality keeps tiny functions with huge ratios out, the statistics keep
run-to-run jitter out, persistence keeps one-off spikes (a checkpoint, a GC storm) out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from perfdiag.analyzer.compare.features import Features, per_step_ms
from perfdiag.analyzer.compare.peers import PeerGroups
from perfdiag.analyzer.compare.stats import peer_reference, robust_scale
from perfdiag.api.thresholds import Thresholds

MIN_STEPS_FOR_PERSISTENCE = 3
"""With fewer steps persistence cannot be judged; window-level outliers stand (and say so)."""
ABSOLUTE_FLOOR_FRACTION = 0.01
"""Smallest σ assumed, as a fraction of the step: 1% of a step is never 'significant' alone."""
EFFECT_SIZE_RATIO = 1.2
"""A material excess at this ratio to the peers that persists across the window's steps is
outlying whatever the dispersion across ranks: with 3 ranks at 1×, 1.5× and 3×, two peers give
no usable MAD, yet the excess shows in every step. Healthy ranks of one host differ by up to
~15% in own time (placement, caches). (A suspect must also compute or block
longer than its peers, analyzer/signals/cpu_cause.py: waiting for a CPU never names a rank.)"""
RECURRING_SHARE = 0.2
"""A statistically outlying, material excess that shows in at least this share of the steps
(and in two of them) recurs: a stall every third step costs as much per step as a steady one."""


@dataclass(frozen=True)
class Deviations:
    """(R, K) arrays aligned with Features.ms."""

    ref: NDArray[np.float64]
    best: NDArray[np.float64]
    excess_ms: NDArray[np.float64]
    excess_fraction: NDArray[np.float64]
    z: NDArray[np.float64]
    ratio: NDArray[np.float64]
    candidate: NDArray[np.bool_]
    steps_outlying: NDArray[np.int64]
    """Steps in which the excess showed (-1 where persistence was not evaluated)."""
    steps_valid: NDArray[np.int64]
    outlying: NDArray[np.bool_]
    peer_count: NDArray[np.int64]
    """(R,) number of peers each rank was compared with."""
    intermittent: NDArray[np.bool_] | None = None
    """(R, K) outlying through recurring steps, not in most steps."""


def compare_peers(
    summary: pa.Table,
    features: Features,
    groups: PeerGroups,
    thresholds: Thresholds,
    excluded: NDArray[np.bool_] | None = None,
) -> Deviations:
    """`excluded` (R,): ranks already named as culprits, which are no reference for others."""
    n_ranks, n_features = features.ms.shape
    ref = np.full((n_ranks, n_features), np.nan)
    best = np.full((n_ranks, n_features), np.nan)
    scale = np.full((n_ranks, n_features), np.nan)
    peer_count = np.zeros(n_ranks, dtype=np.int64)
    step = features.mean_step_ms
    for group in range(len(groups.names)):
        members = groups.members(group)
        stats = peer_reference(
            features.ms[members], None if excluded is None else excluded[members]
        )
        ref[members] = stats.median
        best[members] = stats.best
        floor = (ABSOLUTE_FLOOR_FRACTION * step[members])[:, None]
        scale[members] = robust_scale(
            stats, noise_floor=thresholds.noise_floor, absolute_floor=floor
        )
        peer_count[members] = len(members) - 1

    with np.errstate(invalid="ignore", divide="ignore"):
        excess = features.ms - ref
        excess_fraction = excess / step[:, None]
        z = excess / scale
        ratio = np.where(ref > 0, features.ms / ref, np.where(features.ms > 0, np.inf, 1.0))
    statistical = (z >= thresholds.min_robust_z) & (ratio >= thresholds.min_ratio)
    large = ratio >= EFFECT_SIZE_RATIO
    candidate = (excess_fraction >= thresholds.min_excess_fraction) & (statistical | large)
    candidate &= ~np.isnan(ref)
    intermittent = np.zeros_like(candidate)

    steps_outlying = np.full((n_ranks, n_features), -1, dtype=np.int64)
    steps_valid = np.zeros((n_ranks, n_features), dtype=np.int64)
    outlying = candidate.copy()
    positions = np.flatnonzero(candidate.any(axis=1))
    if len(positions):
        values = per_step_ms(summary, features, positions)  # (P, K, S)
        step_excess = values - ref[positions][:, :, None]
        # A step shows the excess when it holds a material part of it and at least half of the
        # window's mean excess: a few huge steps (bursts) do not make an outlier persistent.
        material = thresholds.step_excess_factor * thresholds.min_excess_fraction
        threshold = np.maximum((material * step[positions])[:, None], 0.5 * excess[positions])[
            :, :, None
        ]
        valid = ~np.isnan(step_excess)
        shows = valid & (np.nan_to_num(step_excess, nan=-np.inf) >= threshold)
        counts = shows.sum(axis=2)
        n_valid = valid.sum(axis=2)
        judged = n_valid >= MIN_STEPS_FOR_PERSISTENCE
        persistent = ~judged | (counts >= thresholds.min_persistence * n_valid)
        # Without its largest step the excess must still be material: one spike (a peer's
        # profiler export at the window's edge, a checkpoint) plus noise does not recur.
        clean = np.where(valid, step_excess, 0.0)
        rest = (clean.sum(axis=2) - clean.max(axis=2, initial=0.0)) / np.maximum(n_valid - 1, 1)
        recurring = (
            judged
            & (counts >= np.maximum(2, np.ceil(RECURRING_SHARE * n_valid)))
            & statistical[positions]
            & (rest >= (thresholds.min_excess_fraction * step[positions])[:, None])
            & ~persistent
        )
        sub_candidate = candidate[positions]
        steps_outlying[positions] = np.where(sub_candidate & judged, counts, -1)
        steps_valid[positions] = n_valid
        outlying[positions] = sub_candidate & (persistent | recurring)
        # By effect size alone, only an excess in most steps (consistency stands in for z).
        outlying[positions] &= statistical[positions] | (persistent & judged)
        intermittent[positions] = sub_candidate & recurring
    return Deviations(
        ref=ref,
        best=best,
        excess_ms=excess,
        excess_fraction=excess_fraction,
        z=z,
        ratio=ratio,
        candidate=candidate,
        steps_outlying=steps_outlying,
        steps_valid=steps_valid,
        outlying=outlying,
        peer_count=peer_count,
        intermittent=intermittent,
    )
