"""Robust peer statistics over a (ranks × features) matrix of one peer group.

Each rank is compared with its peers *excluding itself* (leave-one-out) while the group is
small: with 4 ranks, including the rank under test would let a single outlier drag the median
and MAD towards itself. For large groups one rank cannot move the median, and the group-wide
median/MAD are used (the same numbers, computed once).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

LEAVE_ONE_OUT_MAX = 32
MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True)
class PeerReference:
    median: NDArray[np.float64]
    """(n, K) peers' median per rank and feature (NaN when a rank has no peer)."""
    mad: NDArray[np.float64]
    """(n, K) peers' median absolute deviation."""
    best: NDArray[np.float64]
    """(n, K) the lowest value among the peers (the best peer)."""


def peer_reference(
    values: NDArray[np.float64], excluded: NDArray[np.bool_] | None = None
) -> PeerReference:
    """Each rank's peers' median, MAD and best value. `excluded` ranks (culprits already
    named) are nobody's reference: with few ranks, a second culprit among the peers would
    otherwise raise the median a rank is compared with (1×, 1.5×, 3× ranks: the 1.5× rank's
    peers' median would be 2×). A rank left with no other peer keeps all of them."""
    n, k = values.shape
    if n < 2:
        nan = np.full((n, k), np.nan)
        return PeerReference(median=nan, mad=nan, best=nan)
    usable = np.ones(n, dtype=bool) if excluded is None else ~excluded
    if n > LEAVE_ONE_OUT_MAX:
        pool = values[usable] if usable.sum() >= 2 else values
        median = np.median(pool, axis=0)
        mad = np.median(np.abs(pool - median), axis=0)
        best = np.min(pool, axis=0)
        return PeerReference(
            median=np.broadcast_to(median, (n, k)).copy(),
            mad=np.broadcast_to(mad, (n, k)).copy(),
            best=np.broadcast_to(best, (n, k)).copy(),
        )
    median = np.empty((n, k))
    mad = np.empty((n, k))
    best = np.empty((n, k))
    others = ~np.eye(n, dtype=bool)
    for i in range(n):  # n ≤ LEAVE_ONE_OUT_MAX; each pass is vectorized over features
        chosen = others[i] & usable
        peers = values[chosen] if chosen.any() else values[others[i]]
        median[i] = np.median(peers, axis=0)
        mad[i] = np.median(np.abs(peers - median[i]), axis=0)
        best[i] = np.min(peers, axis=0)
    return PeerReference(median=median, mad=mad, best=best)


def robust_scale(
    ref: PeerReference, *, noise_floor: float, absolute_floor: NDArray[np.float64]
) -> NDArray[np.float64]:
    """σ estimate per rank and feature: MAD-based, but never below the assumed jitter."""
    sigma = MAD_TO_SIGMA * ref.mad
    return np.maximum(np.maximum(sigma, noise_floor * ref.median), absolute_floor)
