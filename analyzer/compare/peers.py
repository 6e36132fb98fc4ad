"""Peer groups: which ranks are compared with which (docs/design.md §4, "same role").

Ranks of different roles (pipeline stages, experts, parameter servers) legitimately behave
differently; comparing them would call a role difference a fault. A `RoleAssigner` maps the
ranks of a capture to groups: from what ranks communicate (`by_collectives`: the collectives,
message and group sizes each rank issues — process-group membership as the trace shows it)
when the capture holds matched collective calls, else from function signatures.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from perfdiag.analyzer.compare.features import LEVEL_FUNCTION, Features, is_named_function

SIGNATURE_MIN_BETA = 0.02
"""A function is part of a rank's signature when its β reaches this."""
SIGNATURE_ABSENT_BETA = 0.002
"""… and clearly absent from a rank below this (the gap keeps jitter from splitting ranks)."""
MAX_DISTINCT_SIGNATURES = 256
"""Beyond this many distinct signatures, ranks are too varied to be a few roles."""
MIN_ROLE_SIZE = 2
"""A 'role' of one rank is an anomaly, not a role: it is merged into its nearest group."""


@dataclass(frozen=True)
class PeerGroups:
    labels: NDArray[np.int64]
    """Group index of each rank position in Features.ranks."""
    names: list[str]
    basis: str
    """How the groups were formed, for the evidence."""

    def members(self, group: int) -> NDArray[np.int64]:
        return np.flatnonzero(self.labels == group)


RoleAssigner = Callable[[Features, float], PeerGroups]
"""(features, role_split_jaccard) → groups."""


def one_group(features: Features, _jaccard: float = 0.0) -> PeerGroups:
    return PeerGroups(
        labels=np.zeros(len(features.ranks), dtype=np.int64),
        names=["all ranks"],
        basis="all ranks compared as one peer group",
    )


def by_function_signature(features: Features, jaccard: float) -> PeerGroups:
    """One group unless the sets of significant functions clearly split the ranks.

    Signature classes are linked (single linkage) unless each runs significant functions the
    other never runs and their Jaccard similarity is below the threshold; groups smaller than
    MIN_ROLE_SIZE join their most similar group. So ranks with an extra hot function stay among
    their peers (that is the anomaly to find), while ranks doing different work split.
    """
    cols = np.array(
        [
            level == LEVEL_FUNCTION and not waiting and is_named_function(fn)
            for level, fn, waiting in zip(
                features.level, features.functions, features.waiting, strict=True
            )
        ],
        dtype=bool,
    )
    # A role's functions are significant on each of its ranks: a function significant on
    # fewer ranks than a role holds is one rank's own (a fault, or a busy host's chance wait
    # stretching some function on one rank), never a role.
    cols &= (features.beta >= SIGNATURE_MIN_BETA).sum(axis=0) >= MIN_ROLE_SIZE
    if len(features.ranks) < 2 * MIN_ROLE_SIZE or not cols.any():
        return one_group(features)
    beta = features.beta[:, cols]
    signatures = beta >= SIGNATURE_MIN_BETA
    distinct, inverse, counts = np.unique(
        signatures, axis=0, return_inverse=True, return_counts=True
    )
    inverse = inverse.reshape(-1)
    if len(distinct) == 1 or len(distinct) > MAX_DISTINCT_SIGNATURES:
        return one_group(features)
    sig = distinct.astype(np.int64)
    inter = sig @ sig.T
    sizes = sig.sum(axis=1)
    union = sizes[:, None] + sizes[None, :] - inter
    similarity = np.divide(inter, union, out=np.ones(inter.shape), where=union > 0)
    # Where a class runs a function at all (any of its ranks above the 'absent' level).
    runs = np.zeros(distinct.shape, dtype=bool)
    np.logical_or.at(runs, inverse, beta >= SIGNATURE_ABSENT_BETA)
    # own[a, b]: class a has a significant function that class b never runs.
    own = (distinct.astype(np.int64) @ (~runs).T.astype(np.int64)) > 0
    different_work = own & own.T

    parent = list(range(len(distinct)))

    def find(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    # A fault adds work; a different role does different work: split only classes that each
    # run significant functions the other never runs, and are dissimilar overall.
    linked = (similarity >= jaccard) | ~different_work
    for a, b in zip(*np.nonzero(np.triu(linked, k=1)), strict=True):
        parent[find(int(a))] = find(int(b))
    cluster = np.array([find(i) for i in range(len(distinct))])
    # Absorb clusters too small to be a role into the most similar other cluster.
    while True:
        totals = {int(r): int(counts[cluster == r].sum()) for r in np.unique(cluster)}
        small = [r for r, size in totals.items() if size < MIN_ROLE_SIZE]
        if not small or len(totals) == 1:
            break
        inside = cluster == small[0]
        pair = np.where(inside[:, None] & ~inside[None, :], similarity, -1.0)
        _, nearest = np.unravel_index(np.argmax(pair), similarity.shape)
        cluster[inside] = cluster[nearest]
    roots = np.unique(cluster)
    if len(roots) == 1:
        return one_group(features)
    labels = np.searchsorted(roots, cluster)[inverse].astype(np.int64)
    names = [f"role {i + 1}" for i in range(len(roots))]
    return PeerGroups(
        labels=labels,
        names=names,
        basis=(
            f"{len(roots)} roles inferred from function signatures (each role runs functions "
            f"with β ≥ {SIGNATURE_MIN_BETA:g} the others never run; Jaccard similarity < "
            f"{jaccard:g})"
        ),
    )


def by_collectives(calls: pa.Table | None) -> RoleAssigner:
    """Roles from what each rank communicates: ranks that issue the same collectives with the
    same message sizes and group sizes, as often per step, hold the same part of the model
    (a pipeline stage's data-parallel replicas; the experts of one layout). Falls back to
    function signatures when that does not split the ranks into groups of ≥ MIN_ROLE_SIZE."""

    def assign(features: Features, jaccard: float) -> PeerGroups:
        fallback = by_function_signature(features, jaccard)
        if calls is None or calls.num_rows == 0 or len(features.ranks) < 2 * MIN_ROLE_SIZE:
            return fallback
        steps = dict(zip(features.ranks.tolist(), features.steps.counts.tolist(), strict=True))
        signature: dict[int, list[tuple[str, int, int, int]]] = {}
        for (rank, collective, msg_bytes, group_size), count in _calls_per_kind(calls):
            per_step = round(count / max(steps.get(rank, 1), 1))
            signature.setdefault(rank, []).append((collective, msg_bytes, group_size, per_step))
        keys = [tuple(sorted(signature.get(int(r), []))) for r in features.ranks.tolist()]
        distinct = sorted(set(keys))
        if len(distinct) < 2:
            return fallback
        labels = np.array([distinct.index(k) for k in keys], dtype=np.int64)
        if np.bincount(labels).min() < MIN_ROLE_SIZE:
            return fallback
        return PeerGroups(
            labels=labels,
            names=[f"role {i + 1}" for i in range(len(distinct))],
            basis=(
                f"{len(distinct)} roles inferred from process-group communication (ranks that "
                "issue the same collectives, message sizes and group sizes per step are peers)"
            ),
        )

    return assign


def _calls_per_kind(calls: pa.Table) -> list[tuple[tuple[int, str, int, int], int]]:
    """How many calls each rank issued of each (collective, message bytes, group size): numpy,
    not Arrow's group_by, whose first call imports pyarrow.acero and pyarrow.dataset (~30 ms of
    a fresh `perfdiag analyze`)."""
    collective = pc.dictionary_encode(
        calls.column("collective").combine_chunks(), null_encoding="encode"
    )
    columns = [
        calls.column("rank").fill_null(-1).to_numpy(),
        collective.indices.to_numpy(),
        calls.column("msg_bytes").fill_null(0).to_numpy(),
        calls.column("group_size").fill_null(0).to_numpy(),
    ]
    kinds, counts = np.unique(
        np.stack([np.asarray(c, dtype=np.int64) for c in columns], axis=1),
        axis=0,
        return_counts=True,
    )
    names = collective.dictionary.to_pylist()
    return [
        ((int(rank), str(names[which]), int(size), int(group)), int(count))
        for (rank, which, size, group), count in zip(kinds.tolist(), counts.tolist(), strict=True)
    ]
