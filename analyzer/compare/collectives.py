"""Collectives matched across ranks (docs/design.md §4): wait vs transfer, the late arriver, and the
achieved bandwidth of each rank's transfers.

Per worker, `collective_calls` (analyzer/load/collective_calls.py) keeps one row per
collective call of the window (a few hundred rows): NCCL kernels on the GPU when the trace has them (their time is the collective's real
time), else host-side gloo/nccl annotations. Across ranks, calls are matched by
(process group, collective, sequence number) — the sequence number being the call's order
within its group (perfdiag.engine.kineto.events) — and each matched instance is split:

  arrival_r  = the call's start on rank r;        last = max over the group's ranks
  wait_r     = min(dur_r, last − arrival_r)       (time spent until the last rank arrived)
  transfer_r = dur_r − wait_r                     (≈ the last arriver's duration)

The rank that arrives last waits least: it is the one the others wait for. This needs trace
clocks that agree across ranks (Kineto writes the host clock; hosts synchronized by NTP/PTP
agree to well under a collective's duration). When most instances do not even overlap in time
across ranks, the clocks are not comparable and the split falls back to durations:
transfer = the shortest duration of the instance, wait_r = dur_r − transfer.

Achieved bandwidth of a transfer: algbw = bytes / transfer time, busbw = algbw × NCCL's bus
factor for the collective (nccl-tests' definitions; n = group size): allreduce 2(n−1)/n,
allgather and reducescatter (n−1)/n (bytes = the whole buffer: n × the per-rank input for
allgather), alltoall (n−1)/n, broadcast/reduce/send/recv 1.

A rank whose own transfer time is materially, persistently and significantly above its peers'
(same thresholds as every other peer comparison) has a slow link: a `slow_worker` finding in
category `network`, its bandwidth against its peers' and the ranks that wait for it as evidence.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from perfdiag.analyzer.compare.features import Features
from perfdiag.analyzer.compare.peers import PeerGroups
from perfdiag.analyzer.compare.stats import peer_reference, robust_scale
from perfdiag.api.thresholds import Thresholds

MIN_ALIGNED_SHARE = 0.9
"""Share of instances whose calls overlap in time across ranks for the clocks to be trusted."""

_BUS_FACTOR_TWICE = {"allreduce"}
_BUS_FACTOR_ONE = {"broadcast", "reduce", "send", "recv", "sendrecv", "barrier"}


def bus_factor(collective: str, n: int) -> float:
    if n <= 1:
        return 1.0
    if collective in _BUS_FACTOR_TWICE:
        return 2.0 * (n - 1) / n
    if collective in _BUS_FACTOR_ONE:
        return 1.0
    return (n - 1) / n


@dataclass(frozen=True)
class Instances:
    """Matched calls: one row per (instance, rank) call, arrays aligned."""

    row: NDArray[np.int64]
    """Row of each call in the calls table."""
    instance: NDArray[np.int64]
    rank: NDArray[np.int64]
    collective: list[str]
    """Collective name of each instance."""
    group_size: NDArray[np.int64]
    """Ranks seen in each instance."""
    step: NDArray[np.int64]
    dur_ns: NDArray[np.int64]
    wait_ns: NDArray[np.int64]
    transfer_ns: NDArray[np.int64]
    last: NDArray[np.bool_]
    """The call of the instance's last arriver."""
    busbw_gbps: NDArray[np.float64]
    """Per call: bus bandwidth of its transfer (NaN without a message size)."""
    algbw_gbps: NDArray[np.float64]
    clock_aligned: bool


def match_instances(calls: pa.Table) -> Instances | None:
    """Match the calls of all ranks into instances and split each into wait and transfer."""
    if calls.num_rows == 0:
        return None
    key = pc.binary_join_element_wise(
        calls["pg_name"], calls["collective"], pc.cast(calls["seq"], pa.string()), "\x1f"
    )
    encoded = pc.dictionary_encode(key).combine_chunks()
    inst = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    n_inst = len(encoded.dictionary)
    rank = calls["rank"].to_numpy().astype(np.int64)
    ts = calls["ts_ns"].to_numpy().astype(np.int64)
    dur = calls["dur_ns"].to_numpy().astype(np.int64)
    end = ts + dur
    members = np.bincount(inst, minlength=n_inst)
    shared = members[inst] >= 2
    inst, rank, ts, dur, end = inst[shared], rank[shared], ts[shared], dur[shared], end[shared]
    rows = np.flatnonzero(shared)
    if not len(rows):
        return None
    last_arrival = np.full(n_inst, np.iinfo(np.int64).min)
    np.maximum.at(last_arrival, inst, ts)
    first_end = np.full(n_inst, np.iinfo(np.int64).max)
    np.minimum.at(first_end, inst, end)
    present = np.unique(inst)
    aligned = float(np.mean(last_arrival[present] <= first_end[present])) >= MIN_ALIGNED_SHARE
    if aligned:
        wait = np.minimum(dur, np.maximum(0, last_arrival[inst] - ts))
        last = ts == last_arrival[inst]
    else:
        shortest = np.full(n_inst, np.iinfo(np.int64).max)
        np.minimum.at(shortest, inst, dur)
        wait = dur - shortest[inst]
        last = dur == shortest[inst]
    transfer = dur - wait

    collective = calls["collective"].to_numpy(zero_copy_only=False)[rows]
    size = members[inst]
    factors = np.array([bus_factor(str(c), int(n)) for c, n in zip(collective, size, strict=True)])
    msg = pc.fill_null(calls["msg_bytes"], -1).to_numpy().astype(np.float64)[rows]
    whole = np.where(collective == "allgather", msg * size, msg)
    with np.errstate(divide="ignore", invalid="ignore"):
        algbw = np.where((msg > 0) & (transfer > 0), whole / transfer, np.nan)  # bytes/ns = GB/s
    names = [""] * n_inst
    for i, c in zip(inst.tolist(), collective.tolist(), strict=True):
        names[i] = str(c)
    return Instances(
        row=rows,
        instance=inst,
        rank=rank,
        collective=names,
        group_size=members,
        step=calls["step"].to_numpy().astype(np.int64)[rows],
        dur_ns=dur,
        wait_ns=wait,
        transfer_ns=transfer,
        last=last,
        busbw_gbps=algbw * factors,
        algbw_gbps=algbw,
        clock_aligned=aligned,
    )


@dataclass(frozen=True)
class RankCollectives:
    """Per rank of Features.ranks: ms per step and bandwidth of its matched collectives."""

    wait_ms: NDArray[np.float64]
    transfer_ms: NDArray[np.float64]
    calls: NDArray[np.int64]
    last_share: NDArray[np.float64]
    """Share of the rank's calls in which it arrived last."""
    caused_wait_ms: NDArray[np.float64]
    """Per step: the waiting of the others in the instances this rank arrived last at."""
    busbw_mu: NDArray[np.float64]
    busbw_sigma: NDArray[np.float64]
    transfer_per_step_ms: NDArray[np.float64]
    """(R, S) transfer ms in each window step."""


@dataclass(frozen=True)
class SlowLink:
    rank: int
    position: int
    excess_ms: float
    transfer_ms: float
    peers_transfer_ms: float
    step_ms: float
    robust_z: float
    steps_outlying: int
    steps: int
    busbw: float
    peers_busbw: float
    victims: list[int]
    victims_wait_ms: float

    @property
    def severity(self) -> float:
        return float(min(1.0, max(0.0, self.excess_ms / self.step_ms))) if self.step_ms else 0.0


@dataclass(frozen=True)
class CollectiveAnalysis:
    instances: Instances
    per_rank: RankCollectives
    slow_links: list[SlowLink]
    instance_count: int


def analyze_collectives(
    calls: pa.Table | None, features: Features, groups: PeerGroups, thresholds: Thresholds
) -> CollectiveAnalysis | None:
    if calls is None or calls.num_rows == 0 or not len(features.ranks):
        return None
    matched = match_instances(calls)
    if matched is None:
        return None
    per_rank = _per_rank(matched, features)
    links = _slow_links(matched, per_rank, features, groups, thresholds)
    return CollectiveAnalysis(
        instances=matched,
        per_rank=per_rank,
        slow_links=links,
        instance_count=len(np.unique(matched.instance)),
    )


def _per_rank(m: Instances, features: Features) -> RankCollectives:
    ranks = features.ranks
    n = len(ranks)
    known = np.isin(m.rank, ranks)
    pos = np.searchsorted(ranks, m.rank[known])
    steps = np.maximum(features.steps.counts, 1).astype(np.float64)
    n_steps = features.steps.durations_ms.shape[1]

    def per_step(values: NDArray[np.int64] | NDArray[np.float64]) -> NDArray[np.float64]:
        total = np.bincount(pos, weights=values[known] / 1e6, minlength=n)
        return np.asarray(total / steps, dtype=np.float64)

    calls = np.bincount(pos, minlength=n).astype(np.int64)
    lasts = np.bincount(pos, weights=m.last[known].astype(np.float64), minlength=n)
    # The others' wait in each instance, charged to its last arriver(s).
    inst_wait = np.bincount(m.instance, weights=m.wait_ns.astype(np.float64))
    last_rows = np.flatnonzero(m.last & known)
    n_last = np.bincount(m.instance[last_rows], minlength=len(inst_wait))
    caused = np.zeros(n)
    share = inst_wait[m.instance[last_rows]] / np.maximum(n_last[m.instance[last_rows]], 1)
    np.add.at(caused, np.searchsorted(ranks, m.rank[last_rows]), share / 1e6)

    bw = m.busbw_gbps[known]
    ok = ~np.isnan(bw)
    mu = np.full(n, np.nan)
    sigma = np.full(n, np.nan)
    counts = np.bincount(pos[ok], minlength=n)
    sums = np.bincount(pos[ok], weights=bw[ok], minlength=n)
    squares = np.bincount(pos[ok], weights=bw[ok] ** 2, minlength=n)
    has = counts > 0
    mu[has] = sums[has] / counts[has]
    sigma[has] = np.sqrt(np.maximum(squares[has] / counts[has] - mu[has] ** 2, 0.0))

    transfer_steps = np.zeros((n, n_steps))
    step = m.step[known]
    inside = (step >= 0) & (step < n_steps)
    np.add.at(transfer_steps, (pos[inside], step[inside]), m.transfer_ns[known][inside] / 1e6)
    return RankCollectives(
        wait_ms=per_step(m.wait_ns),
        transfer_ms=per_step(m.transfer_ns),
        calls=calls,
        last_share=np.divide(lasts, calls, out=np.zeros(n), where=calls > 0),
        caused_wait_ms=caused / steps,
        busbw_mu=mu,
        busbw_sigma=sigma,
        transfer_per_step_ms=transfer_steps,
    )


def _slow_links(
    m: Instances,
    per_rank: RankCollectives,
    features: Features,
    groups: PeerGroups,
    thresholds: Thresholds,
) -> list[SlowLink]:
    """Ranks whose own transfers are slower than their peers' (same rules as compare.py)."""
    step = features.mean_step_ms
    values = per_rank.transfer_ms[:, None]
    found: list[SlowLink] = []
    for group in range(len(groups.names)):
        members = groups.members(group)
        members = members[per_rank.calls[members] > 0]
        if len(members) < 2:
            continue
        stats = peer_reference(values[members])
        floor = (0.01 * step[members])[:, None]
        scale = robust_scale(stats, noise_floor=thresholds.noise_floor, absolute_floor=floor)
        ref = stats.median[:, 0]
        excess = values[members, 0] - ref
        with np.errstate(divide="ignore", invalid="ignore"):
            z = excess / scale[:, 0]
            ratio = np.where(ref > 0, values[members, 0] / ref, np.inf)
        outlying = (
            (excess >= thresholds.min_excess_fraction * step[members])
            & (z >= thresholds.min_robust_z)
            & (ratio >= thresholds.min_ratio)
        )
        for j in np.flatnonzero(outlying).tolist():
            i = int(members[j])
            shown, valid = _persistence(per_rank, features, thresholds, i, float(ref[j]))
            if valid >= 3 and shown < thresholds.min_persistence * valid:
                continue
            peers = members[members != i]
            victims = _victims_of(m, features, int(features.ranks[i]))
            found.append(
                SlowLink(
                    rank=int(features.ranks[i]),
                    position=i,
                    excess_ms=float(excess[j]),
                    transfer_ms=float(values[i, 0]),
                    peers_transfer_ms=float(ref[j]),
                    step_ms=float(step[i]),
                    robust_z=float(z[j]),
                    steps_outlying=shown if valid >= 3 else -1,
                    steps=valid,
                    busbw=float(per_rank.busbw_mu[i]),
                    peers_busbw=float(np.nanmedian(per_rank.busbw_mu[peers]))
                    if np.any(~np.isnan(per_rank.busbw_mu[peers]))
                    else float("nan"),
                    victims=victims[0],
                    victims_wait_ms=victims[1],
                )
            )
    return found


def _persistence(
    per_rank: RankCollectives, features: Features, thresholds: Thresholds, i: int, ref: float
) -> tuple[int, int]:
    durations = features.steps.durations_ms[i]
    valid = ~np.isnan(durations)
    per_step = per_rank.transfer_per_step_ms[i][valid]
    n_valid = int(valid.sum())
    # The same rule as compare.py: each step holds a material part of the excess.
    step = float(features.mean_step_ms[i])
    excess = per_rank.transfer_ms[i] - ref
    threshold = max(
        thresholds.step_excess_factor * thresholds.min_excess_fraction * step, 0.5 * excess
    )
    return int(np.sum(per_step - ref >= threshold)), n_valid


def _victims_of(m: Instances, features: Features, rank: int) -> tuple[list[int], float]:
    """Ranks that wait in the instances `rank` arrives last at, and their median wait per step."""
    mine = np.unique(m.instance[(m.rank == rank) & m.last])
    rows = np.isin(m.instance, mine) & (m.rank != rank)
    if not rows.any():
        return [], 0.0
    others = m.rank[rows]
    waits = np.bincount(
        np.searchsorted(features.ranks, others), weights=m.wait_ns[rows] / 1e6,
        minlength=len(features.ranks),
    )  # fmt: skip
    steps = np.maximum(features.steps.counts, 1)
    per_step = waits / steps
    victims = np.flatnonzero(per_step > 0)
    if not len(victims):
        return [], 0.0
    return [int(features.ranks[v]) for v in victims], float(np.median(per_step[victims]))
