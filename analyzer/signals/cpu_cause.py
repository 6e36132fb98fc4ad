"""What a rank did with its time, from its process's CPU accounting (`HostUsage`, per step).

For the training thread, a step is: on a CPU (working), runnable but waiting for a CPU (run
queue; a cgroup's throttled time shows here too), or neither (off-CPU: asleep, blocked on I/O,
a lock, a queue, the GIL, or a collective). The process's other threads add their own CPU.
Compared with its peers (deltas of medians, ms per step), this says why a rank is slow:

| cause | what differs from the peers | category |
| --- | --- | --- |
| work | the training thread computes longer | the contributors' (python, cpu_op…) |
| blocked | the training thread is off-CPU longer outside communication | the contributors' |
| threads | the process's other threads use more CPU (a busy background thread, more intra-op threads), or they do and the training thread waits for a CPU longer | host |
| throttled | the cgroup's CPU quota held the process back | host |
| starved | the rank waits for a CPU while its peers get one (a noisy neighbour, fewer cores) | host |
| contended | only run-queue wait, on a host where every rank waits: chance, no rank is named | – |
| device | the rank's GPU kernels and copies hold at least half its excess: whatever its threads did meanwhile (a training thread asleep in a synchronize, a gloo thread spinning in a device-to-host copy) was waiting for its own GPU | the contributors' (gpu_compute, gpu_memory) |

Every rule reads one rank beside its peers (`PeerCpu`). `explain_excess` decides the cause of a
suspect's excess (with its extra computation step by step, `cpu_work_excess`, where its
functions' excess is mostly waiting for a CPU); `held_back` decides whether the host held back
a rank whose own time does not stand out. A throttling quota comes first in both (`_throttled`).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from perfdiag.analyzer.compare.features import Features
from perfdiag.analyzer.load.worker_table import WorkerMetas
from perfdiag.analyzer.signals.hardware import HEALTHY_PEER_FLOOR
from perfdiag.analyzer.signals.host_usage import outside_communication
from perfdiag.api.schema import WorkerMeta

BUSY_THREADS_FACTOR = 4.0
"""Other threads' extra CPU, in materiality thresholds, that makes them a cause: gloo's and the
profiler's threads differ by a few ms per step between healthy ranks."""
HEALTHY_RUN_SHARE = HEALTHY_PEER_FLOOR["cpu_run_fraction"]
"""Peers that run ≥ this share of their runnable time get a CPU: the host is not oversubscribed."""
CauseKind = Literal["work", "blocked", "threads", "throttled", "starved", "contended", "device"]
GPU_WORK = frozenset({"gpu_compute", "gpu_memory"})
"""Finding categories of time the GPU spends on the rank's own work (kernels, copies): the CPU
accounting does not see it, and its threads' waits for it are no cause of their own."""


@dataclass(frozen=True)
class RankCpu:
    """(R,) ms per step of each rank (NaN where unknown), aligned with Features.ranks."""

    on_cpu: NDArray[np.float64]
    cpu_wait: NDArray[np.float64]
    other_threads: NDArray[np.float64]
    """The process's threads that are no part of its training (a user's background thread,
    intra-op pools), on a CPU, ms per step: PyTorch's own threads are not among them."""
    process_wait: NDArray[np.float64]
    """All of the process's threads' run-queue wait."""
    throttled: NDArray[np.float64]
    off_cpu: NDArray[np.float64]
    """Training thread neither running nor runnable, outside communication."""
    threads: NDArray[np.float64]
    quota_cores: NDArray[np.float64]
    host_load: NDArray[np.float64]
    """(R,) runnable threads per core on each rank's host (> 1: oversubscribed)."""
    host_runnable: float | None
    host_cores: int | None
    on_cpu_steps: NDArray[np.float64] | None = None
    """(R, W) the training thread's on-CPU ms in each step, when the hook read it at every step
    boundary on every rank (HostUsage.exact_steps); None when any rank's is sampled."""
    children_cpu: NDArray[np.float64] | None = None
    """(R,) ms per step its child processes (DataLoader workers) were on a CPU, when every
    rank's were sampled."""
    children_wait: NDArray[np.float64] | None = None
    """(R,) ms per step its child processes waited for a CPU."""
    torch_threads: NDArray[np.float64] | None = None
    """(R,) ms per step PyTorch's own threads (the autograd engine's device threads, the
    process groups') were on a CPU: the rank's own work beside its training thread's."""

    @property
    def run_share(self) -> NDArray[np.float64]:
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.on_cpu / (self.on_cpu + self.cpu_wait)

    @property
    def oversubscribed(self) -> bool:
        return bool(
            self.host_runnable is not None
            and self.host_cores
            and self.host_runnable > self.host_cores
        )


EDGE_STEPS_FROM = 5
"""With at least this many steps, the window's first and last are left out of the means: the
profiler starts just before the first and each rank exports its trace just after the last, and
a sample interpolated across that edge carries perfdiag's own CPU into the job's step."""


def _mean(values: list[float] | None) -> float:
    if not values:
        return float("nan")
    inner = values[1:-1] if len(values) >= EDGE_STEPS_FROM else values
    return float(np.mean(inner))


def rank_cpu(metas: Mapping[int, WorkerMeta], features: Features) -> RankCpu | None:
    """The ranks' CPU accounting; None unless every rank has host samples."""
    if not WorkerMetas.of(metas).all_host_usage(features.ranks):
        return None
    usages = [metas[int(rank)].host_usage for rank in features.ranks]
    if not usages or any(u is None for u in usages):
        return None
    n = len(usages)
    on_cpu, wait, other, throttled, threads, quota, pwait, load, torch_cpu = (
        np.full(n, np.nan) for _ in range(9)
    )
    runnable: list[float] = []
    cores: list[int] = []
    for i, usage in enumerate(usages):
        assert usage is not None
        on_cpu[i] = _mean(usage.main_run_ms)
        wait[i] = _mean(outside_communication(usage))
        torch_cpu[i] = _mean(usage.torch_threads_cpu_ms) if usage.torch_threads_cpu_ms else 0.0
        other[i] = _mean(usage.process_cpu_ms) - on_cpu[i] - torch_cpu[i]
        pwait[i] = _mean(usage.process_wait_ms)
        throttled[i] = _mean(usage.throttled_ms) if usage.throttled_ms is not None else 0.0
        threads[i] = usage.threads if usage.threads is not None else np.nan
        quota[i] = usage.cpu_quota_cores if usage.cpu_quota_cores is not None else np.nan
        if usage.host_runnable is not None and usage.host_cores:
            load[i] = usage.host_runnable / usage.host_cores
        if usage.host_runnable is not None:
            runnable.append(usage.host_runnable)
        if usage.host_cores:
            cores.append(usage.host_cores)
    non_wait = features.ms[:, features.non_wait_index]  # own time: run-queue wait taken out
    off_cpu = np.maximum(non_wait - on_cpu, 0.0)
    on_cpu_steps = None
    if all(u is not None and u.exact_steps for u in usages):
        width = max(len(u.main_run_ms) for u in usages if u is not None)
        on_cpu_steps = np.full((n, width), np.nan)
        for i, usage in enumerate(usages):
            assert usage is not None
            on_cpu_steps[i, : len(usage.main_run_ms)] = usage.main_run_ms
        if features.non_wait_wall_ms is not None:
            # Off-CPU time from exact counters only: wall time outside communication less the
            # time on a CPU and ALL the run-queue wait. Which part of that wait fell inside a
            # collective is sampled (smeared across the sampler's gaps on a busy host), so
            # this is the least the rank can have been blocked: a rank is named "blocked"
            # only for that.
            run_all = np.array([np.mean(u.main_run_ms) if u else np.nan for u in usages])
            wait_all = np.array([np.mean(u.main_wait_ms) if u else np.nan for u in usages])
            off_cpu = np.maximum(features.non_wait_wall_ms - run_all - wait_all, 0.0)
    children_cpu = children_wait = None
    if all(u is not None and u.children_cpu_ms and u.children_wait_ms for u in usages):
        children_cpu = np.array([_mean(u.children_cpu_ms) if u else np.nan for u in usages])
        children_wait = np.array([_mean(u.children_wait_ms) if u else np.nan for u in usages])
    return RankCpu(
        children_cpu=children_cpu,
        children_wait=children_wait,
        on_cpu=on_cpu,
        cpu_wait=wait,
        other_threads=np.maximum(other, 0.0),
        torch_threads=torch_cpu,
        process_wait=pwait,
        throttled=throttled,
        off_cpu=off_cpu,
        threads=threads,
        quota_cores=quota,
        host_load=load,
        host_runnable=float(np.median(runnable)) if runnable else None,
        host_cores=int(np.median(cores)) if cores else None,
        on_cpu_steps=on_cpu_steps,
    )


def peer_median(values: NDArray[np.float64], peers: NDArray[np.int64]) -> float:
    """The peers' median, ignoring peers without a value (NaN when none has one)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(np.nanmedian(values[peers])) if len(peers) else float("nan")


@dataclass(frozen=True, eq=False)
class PeerCpu:
    """One rank's CPU accounting beside its peers', with the threshold that makes a difference
    material: what every rule of this module reads."""

    cpu: RankCpu
    position: int
    """The rank's row in `cpu` (Features.ranks order)."""
    peers: NDArray[np.int64]
    """Its peers' rows, itself left out."""
    material_ms: float

    @classmethod
    def of(
        cls, cpu: RankCpu, position: int, peers: NDArray[np.int64], material_ms: float
    ) -> PeerCpu:
        """`peers` may hold the rank itself: it is left out."""
        return cls(cpu, position, peers[peers != position], material_ms)

    def median(self, values: NDArray[np.float64]) -> float:
        return peer_median(values, self.peers)

    def delta(self, values: NDArray[np.float64]) -> float:
        """The rank's value less its peers' median (0 where either is unknown)."""
        d = float(values[self.position]) - self.median(values)
        return d if np.isfinite(d) else 0.0

    @cached_property
    def dilation(self) -> float:
        """How much wall time a ms of extra computation costs the rank on its host: 1 / the run
        share of the group (on a busy host each ms on a CPU brings its share of waiting for
        one), at most 4. The group's median share, not the rank's own: which rank waits longer
        than the others is chance, and a rank is never named for that."""
        share = peer_median(self.cpu.run_share, np.r_[self.peers, self.position])
        return 1.0 / min(max(share, 0.25), 1.0) if np.isfinite(share) else 1.0

    def evidence(self) -> dict[str, Any]:
        cpu, i = self.cpu, self.position

        def pair(values: NDArray[np.float64]) -> dict[str, float | None]:
            own, ref = float(values[i]), self.median(values)
            return {
                "rank": round(own, 3) if np.isfinite(own) else None,
                "peers_median": round(ref, 3) if np.isfinite(ref) else None,
            }

        evidence: dict[str, Any] = {
            "on_cpu_ms_per_step": pair(cpu.on_cpu),
            "cpu_wait_ms_per_step": pair(cpu.cpu_wait),
            "off_cpu_ms_per_step": pair(cpu.off_cpu),
            "other_threads_cpu_ms_per_step": pair(cpu.other_threads),
            **(
                {"torch_threads_cpu_ms_per_step": pair(cpu.torch_threads)}
                if cpu.torch_threads is not None
                else {}
            ),
            "throttled_ms_per_step": pair(cpu.throttled),
            "run_share": pair(cpu.run_share),
            "threads": pair(cpu.threads),
        }
        if cpu.children_cpu is not None and cpu.children_wait is not None:
            evidence["children_cpu_ms_per_step"] = pair(cpu.children_cpu)
            evidence["children_wait_ms_per_step"] = pair(cpu.children_wait)
        if np.isfinite(cpu.quota_cores[i]):
            evidence["cpu_quota_cores"] = round(float(cpu.quota_cores[i]), 3)
        if cpu.host_runnable is not None:
            evidence["host_runnable_threads"] = cpu.host_runnable
            evidence["host_cores"] = cpu.host_cores
        return evidence

    def thread_count(self) -> str:
        threads = self.cpu.threads[self.position]
        return f" ({int(threads)} threads)" if np.isfinite(threads) else ""


@dataclass(frozen=True)
class CpuWork:
    """A rank whose training thread computes longer than its peers', step by step."""

    excess_ms: float
    """Its extra on-CPU time per step over its peers' (per-step median), times its dilation."""
    on_cpu_ms: float
    peers_on_cpu_ms: float
    steps_shown: int
    """Steps in which the extra reaches half the materiality threshold."""
    steps: int
    floor_ratio: float = float("nan")
    """Its least on-CPU time in a step over its peers' least (their median), over the same
    steps: what its work costs when nothing slows it, against what theirs does."""


@dataclass(frozen=True)
class CpuCause:
    kind: CauseKind
    excess_ms: float
    """What this cause costs the rank per step (its share of the excess, or the time it was
    held back for the host causes)."""
    evidence: dict[str, Any]
    sentence: str
    own_ms: float | None = None
    """What the CPU accounting backs of the excess (work, blocked, threads): the rank's extra
    computation times its dilation, its material extra off-CPU time, its busy threads' CPU."""
    work: CpuWork | None = None
    """The rank's extra computation step by step, when the cause is of it alone: its functions'
    excess was mostly waiting for a CPU, and `excess_ms` is this work's."""


def explain_excess(
    against: PeerCpu, excess_ms: float, gpu_ms: float = 0.0, work: CpuWork | None = None
) -> CpuCause:
    """Why the rank spends `excess_ms` of own time more than its peers; `gpu_ms`: how much of
    it is GPU time (its kernels and copies, GPU_WORK) beyond its peers'. `work`: its extra
    computation step by step (`cpu_work_excess`), which the rank is named for, and only that,
    when its functions' excess is mostly waiting for a CPU."""
    cause = _cause_of_excess(against, excess_ms, gpu_ms)
    if cause.kind == "contended" and work is not None:
        return replace(_cause_of_excess(against, work.excess_ms, gpu_ms), work=work)
    return cause


def _cause_of_excess(against: PeerCpu, excess_ms: float, gpu_ms: float) -> CpuCause:
    cpu, material_ms = against.cpu, against.material_ms
    d_main = against.delta(cpu.on_cpu)
    # PyTorch's own threads computing more (a backward that recomputes its forward, larger
    # shapes on the autograd engine's device thread) is the rank computing more.
    d_torch = against.delta(cpu.torch_threads) if cpu.torch_threads is not None else 0.0
    d_run = d_main + max(d_torch, 0.0)
    d_off = against.delta(cpu.off_cpu)
    d_other = against.delta(cpu.other_threads)
    evidence = against.evidence()
    throttled = _throttled(against, material_ms)
    if throttled is not None:
        return replace(throttled, excess_ms=excess_ms)
    if gpu_ms >= material_ms and gpu_ms >= 0.5 * excess_ms:
        # Kernel and copy times are the GPU's own clock: no CPU share dilates them. While the
        # GPU runs them, the training thread sleeps in a synchronize and a communication
        # thread may spin in a device-to-host copy; that CPU time is the wait, not the cause.
        return CpuCause(
            "device",
            excess_ms,
            evidence,
            f"its GPU spent {gpu_ms:.1f} ms/step longer than its peers' in its own kernels and "
            f"copies; what its threads did meanwhile (training thread off-CPU {d_off:+.1f}, "
            f"other threads' CPU {d_other:+.1f} ms/step against its peers') waits for them",
            gpu_ms,
        )
    busy_threads = d_other >= BUSY_THREADS_FACTOR * material_ms
    # The CPU accounting must back the excess: what a function's time holds beyond what the
    # rank computed or blocked is run-queue wait, which names no rank. Extra computation on a
    # busy host brings its own share of waiting (1 / run share), which is the rank's doing;
    # off-CPU time is derived (step less the rest), so only a material amount of it counts.
    dilation = against.dilation
    blocked = d_off if d_off >= material_ms else 0.0
    own = max(d_run, 0.0) * dilation + blocked + (d_other if busy_threads else 0.0)
    if own < material_ms or own < 0.5 * excess_ms:
        return CpuCause(
            "contended",
            excess_ms,
            evidence,
            f"its functions ran {excess_ms:.1f} ms/step longer than its peers', but it neither "
            f"computed nor blocked materially longer (on-CPU {d_run:+.1f}, off-CPU {d_off:+.1f}, "
            f"other threads {d_other:+.1f} ms/step): the difference is waiting for a CPU, "
            "which rank waits longest is chance on a busy host; not named",
        )
    if busy_threads and d_other >= 0.5 * excess_ms and d_other > max(d_off, d_run):
        return CpuCause(
            "threads",
            excess_ms,
            evidence,
            f"threads other than its training thread used {d_other:.1f} ms/step of CPU more "
            f"than its peers'{against.thread_count()}: they hold the GIL or the cores the "
            "training thread needs",
            own,
        )
    if d_off >= 0.5 * excess_ms and d_off > d_run * dilation:
        waited = _children_waited(against, d_off)
        if waited is not None:
            return CpuCause("contended", excess_ms, evidence, waited)
        return CpuCause(
            "blocked",
            excess_ms,
            evidence,
            f"its training thread was blocked (off-CPU: sleeping, I/O, a lock or a queue) "
            f"{d_off:.1f} ms/step longer than its peers', not computing"
            + _children_computed(against),
            own,
        )
    by_torch = (
        f" ({d_torch:.1f} of it on PyTorch's own threads: the autograd engine's, the process "
        "groups')"
        if d_torch >= 0.5 * max(d_run, 0.0) and d_torch > 0
        else ""
    )
    return CpuCause(
        "work",
        excess_ms,
        evidence,
        f"its training thread computed {max(d_run, 0.0):.1f} ms/step longer than its peers'"
        + by_torch,
        own,
    )


CHILDREN_MORE_RATIO = 1.25
"""A rank's child processes computed more than its peers' when their CPU time is at least this
many times the peers' median (and 0.5 ms/step more): DataLoader workers of one job do the same
work per batch (within 1% of each other in the fault suite), and a slow worker does several
times theirs, whatever the host's load makes of the step time."""


def _children_extra_cpu(against: PeerCpu) -> float:
    """The rank's child processes' CPU time per step over its peers' median, when it is more
    than theirs (0 otherwise, or without children samples)."""
    children_cpu = against.cpu.children_cpu
    if children_cpu is None:
        return 0.0
    extra = against.delta(children_cpu)
    reference = against.median(children_cpu)
    if extra < 0.5 or extra < (CHILDREN_MORE_RATIO - 1.0) * reference:
        return 0.0
    return extra


def _children_waited(against: PeerCpu, d_off: float) -> str | None:
    """Why a rank blocked longer than its peers is not named: its child processes (DataLoader
    workers, whose batches it waits for) waited for a CPU at least half that much longer,
    without computing more than its peers' children. Which process waits for a CPU longest
    is chance on a busy host. None otherwise, or without children samples."""
    cpu = against.cpu
    if cpu.children_cpu is None or cpu.children_wait is None:
        return None
    d_child_wait = against.delta(cpu.children_wait)
    if d_child_wait < 0.5 * d_off or _children_extra_cpu(against) > 0:
        return None
    d_child_run = against.delta(cpu.children_cpu)
    return (
        f"its training thread was blocked {d_off:.1f} ms/step longer than its peers', waiting "
        f"for its child processes (DataLoader workers), which waited {d_child_wait:.1f} ms/step "
        f"longer for a CPU than its peers' and computed no more ({d_child_run:+.1f} ms/step): "
        "which process waits for a CPU longest is chance on a busy host; not named"
    )


def _children_computed(against: PeerCpu) -> str:
    """What its child processes computed more than its peers', when they did."""
    extra = _children_extra_cpu(against)
    if not extra:
        return ""
    return (
        f"; its child processes (DataLoader workers) computed {extra:.1f} ms/step longer "
        "than its peers'"
    )


MIN_CPU_RATIO = 1.1
"""The rank's on-CPU time over its peers': healthy ranks of one job stay within a few percent
(the hook's exact counters, 4 ranks on 2 cores, quiet or beside a CPU hog)."""
MIN_SHOWN_SHARE = 0.2
"""A recurring excess (every few steps) shows in at least this share of the steps, and in two."""


def cpu_work_excess(against: PeerCpu) -> CpuWork | None:
    """The rank's extra computation on its training thread, step by step against the median of
    its peers in the same step, when the hook's exact per-step counters are there: on-CPU time
    is the rank's own, whatever the host's run queue does, so this finds extra work a busy host
    hides in the functions' wall times. None when it is not material or not recurring."""
    rows, i, peers = against.cpu.on_cpu_steps, against.position, against.peers
    if rows is None or not len(peers):
        return None
    inner = rows[:, 1:-1] if rows.shape[1] >= EDGE_STEPS_FROM else rows
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ref = np.nanmedian(inner[peers], axis=0)
    own = inner[i]
    valid = np.isfinite(own) & np.isfinite(ref)
    if valid.sum() < 2:
        return None
    own, ref = own[valid], ref[valid]
    extra = (own - ref) * against.dilation
    excess = float(np.mean(extra))
    if float(np.mean(own - ref)) < _peers_step_noise(inner[:, valid], peers, i):
        # Work that moves from rank to rank step by step (uneven inputs): this rank's surplus
        # is no larger than any peer's swing from step to step. Imbalance judges that.
        return None
    shown = int(np.sum(extra >= 0.5 * against.material_ms))
    ratio = float(np.mean(own) / np.mean(ref)) if np.mean(ref) > 0 else float("inf")
    if (
        excess < against.material_ms
        or ratio < MIN_CPU_RATIO
        or shown < max(2, int(np.ceil(MIN_SHOWN_SHARE * len(extra))))
    ):
        return None
    floor = _floor_ratio(own, inner[np.ix_(peers, valid)])
    return CpuWork(excess, float(np.mean(own)), float(np.mean(ref)), shown, len(extra), floor)


def _floor_ratio(own: NDArray[np.float64], peer_rows: NDArray[np.float64]) -> float:
    """The rank's least on-CPU time in a step over the median of its peers' least, ms over ms
    (`peer_rows`: (peers, steps), NaN where unknown). A core shared with other busy threads,
    caches or memory bandwidth taken by a neighbour only add to a step's computation, and only
    for a while: in its best step a healthy rank computes what its peers do in theirs, while
    more work per call (a larger batch) shows in every step, its best included."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        peers_floor = float(np.nanmedian(np.nanmin(peer_rows, axis=1)))
    if not np.isfinite(peers_floor) or peers_floor <= 0:
        return float("nan")
    return float(np.min(own)) / peers_floor


def _peers_step_noise(rows: NDArray[np.float64], peers: NDArray[np.int64], i: int) -> float:
    """The median peer's standard deviation, over steps, of its on-CPU time against the others'
    (the rank included) in the same step, ms."""
    members = np.r_[peers, i]
    spreads = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for j in peers.tolist():
            others = members[members != j]
            spreads.append(float(np.nanstd(rows[j] - np.nanmedian(rows[others], axis=0))))
    finite = [x for x in spreads if np.isfinite(x)]
    return float(np.median(finite)) if finite else 0.0


def held_back(against: PeerCpu, throttled_material_ms: float | None = None) -> CpuCause | None:
    """A rank held back by the host (a CPU quota, a CPU taken by others) rather than its own
    work; None when it is not, or when every rank waits alike (chance on a busy host).
    `throttled_material_ms`: the materiality of throttled time (default `material_ms`)."""
    if not len(against.peers):
        return None
    cpu, i, material_ms = against.cpu, against.position, against.material_ms
    throttled = _throttled(
        against, material_ms if throttled_material_ms is None else throttled_material_ms
    )
    if throttled is not None:
        return throttled
    d_wait = against.delta(cpu.cpu_wait)
    d_other = against.delta(cpu.other_threads)
    if d_other >= BUSY_THREADS_FACTOR * material_ms and d_wait >= material_ms:
        return CpuCause(
            "threads",
            d_wait,
            against.evidence(),
            f"its other threads used {d_other:.1f} ms/step of CPU more than its peers'"
            f"{against.thread_count()}, and its training thread waited {d_wait:.1f} ms/step "
            "longer for a CPU: its own threads take the cores it needs",
        )
    if d_other >= BUSY_THREADS_FACTOR * material_ms and cpu.host_load[i] > 1.0 and cpu.host_cores:
        # On a host with more runnable threads than cores, the CPU its extra threads burn is
        # taken from every rank on it, its own training thread no more than the others: the
        # job loses about that CPU spread over the cores.
        return CpuCause(
            "threads",
            d_other / cpu.host_cores,
            against.evidence(),
            f"its other threads used {d_other:.1f} ms/step of CPU more than its peers'"
            f"{against.thread_count()} on a host with {cpu.host_runnable or 0:.1f} runnable "
            f"threads on {cpu.host_cores} cores: they take CPU time from every rank there",
        )
    peers_share = against.median(cpu.run_share)
    # Starved by its host: the rank's host has more runnable threads than cores while its peers'
    # hosts do not. On a host the rank shares with its peers, which of them waits is chance.
    own_host_busy = bool(cpu.host_load[i] > 1.0) and not against.median(cpu.host_load) > 1.0
    if (
        d_wait >= material_ms
        and own_host_busy
        and np.isfinite(peers_share)
        and peers_share >= HEALTHY_RUN_SHARE
    ):
        return CpuCause(
            "starved",
            d_wait,
            against.evidence(),
            f"it waited {d_wait:.1f} ms/step longer than its peers for a CPU: it ran "
            f"{_pct(cpu.run_share[i])} of its runnable time, its peers {_pct(peers_share)} "
            "(another process on its cores, or fewer cores)",
        )
    return None


def _throttled(against: PeerCpu, material_ms: float) -> CpuCause | None:
    """The cgroup's CPU quota held the rank back by at least `material_ms` a step more than its
    peers: the first cause of a rank, whatever else it did."""
    if not len(against.peers):
        return None
    cpu, i = against.cpu, against.position
    d_throttled = against.delta(cpu.throttled)
    if d_throttled < material_ms:
        return None
    quota = cpu.quota_cores[i]
    limit = f" (a limit of {quota:.2f} CPU)" if np.isfinite(quota) else ""
    return CpuCause(
        "throttled",
        max(d_throttled, against.delta(cpu.cpu_wait)),
        against.evidence(),
        f"its CPU quota{limit} throttled it {cpu.throttled[i]:.1f} ms/step (peers "
        f"{against.median(cpu.throttled):.1f}); it ran "
        f"{_pct(cpu.run_share[i])} of its runnable time, its peers "
        f"{_pct(against.median(cpu.run_share))}",
    )


def _pct(x: float) -> str:
    return f"{x:.0%}" if np.isfinite(x) else "an unknown share"


def host_note(cpu: RankCpu) -> str | None:
    """One sentence on an oversubscribed host, for the verdict's notes."""
    if not cpu.oversubscribed:
        return None
    with np.errstate(invalid="ignore", divide="ignore"):
        share = cpu.cpu_wait / (cpu.on_cpu + cpu.cpu_wait + cpu.off_cpu)
    finite = share[np.isfinite(share)]
    spread = (
        f"; the ranks' training threads waited for a CPU {np.min(finite):.0%}–{np.max(finite):.0%}"
        " of their time outside communication"
        if len(finite)
        else ""
    )
    return (
        f"The host was oversubscribed: {cpu.host_runnable:.1f} runnable threads on "
        f"{cpu.host_cores} cores{spread}. Only time a rank spends on its own (computing or "
        "blocked) names it; waiting for a CPU does not."
    )
