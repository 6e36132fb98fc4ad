"""Slow-worker fusion: from per-feature outliers to culprits, victims and a root cause.

Victims vs culprit (data-parallel): the slow rank's peers wait for it in collectives, so they
show MORE communication time and the culprit LESS. A rank is therefore named only for time it
spends *outside* communication ("non-wait" time, idle included: uninstrumented work is still
work) in excess of its peers; ranks whose extra time is communication are its victims. A rank
that waits more than its peers is never a culprit here.

Collectives matched across ranks (analyzer/compare/collectives.py: arrival order, wait vs transfer)
add the slow-link case and drop `communication_outliers` that turn out to be waiting.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from perfdiag.analyzer.compare.features import (
    LEVEL_CATEGORY,
    LEVEL_FUNCTION,
    Features,
    finding_category,
    is_idle,
    is_named_function,
)
from perfdiag.analyzer.compare.outliers import Deviations
from perfdiag.analyzer.compare.peers import PeerGroups
from perfdiag.analyzer.signals.contention import Contended, CpuWait, explained_by_contention
from perfdiag.analyzer.signals.cpu_cause import (
    GPU_WORK,
    CpuCause,
    CpuWork,
    RankCpu,
    cpu_work_excess,
    explain_excess,
    held_back,
)
from perfdiag.analyzer.signals.hardware import ResourceAnomaly
from perfdiag.analyzer.text import short
from perfdiag.api.taxonomy import COMMUNICATION
from perfdiag.api.thresholds import Thresholds

ExcessBasis = Literal["total", "outlying", "cpu"]
TOP_CONTRIBUTORS = 5
HOLDS_SHARE = 0.5
"""A rank found computing longer is named when one function or category holds this share of
its extra own time (wall time outside communication, as functions are measured)."""
VICTIM_SHARE = 0.5
"""A peer is a victim when it waits at least this share of the culprit's excess longer."""
UNATTRIBUTED = "time outside any profiled operation"
AUTOGRAD = "<built-in method run_backward of "
"""The autograd engine's entry: DDP's reducer waits inside it for the gradient all-reduce, so
time a rank is blocked (off-CPU) there is waiting for communication, not its own."""


@dataclass(frozen=True)
class Contributor:
    function: str | None
    category: str
    ms: float
    peers_ms: float
    best_peer_ms: float
    excess_ms: float
    beta: float
    peers_beta: float
    robust_z: float
    ratio: float
    steps_outlying: int
    steps: int
    outlying: bool

    def evidence(self) -> dict[str, object]:
        return {
            "function": self.function,
            "category": self.category,
            "beta": round(self.beta, 4),
            "peers_median_beta": round(self.peers_beta, 4),
            "ms_per_step": round(self.ms, 3),
            "peers_median_ms_per_step": round(self.peers_ms, 3),
            "best_peer_ms_per_step": round(self.best_peer_ms, 3),
            "excess_ms_per_step": round(self.excess_ms, 3),
            "robust_z": _finite(self.robust_z),
            "ratio_to_peers": _finite(self.ratio),
            "steps_outlying": self.steps_outlying if self.steps_outlying >= 0 else None,
            "steps": self.steps,
            "outlying": self.outlying,
        }


@dataclass(frozen=True)
class Victims:
    ranks: list[int]
    wait_ms: float
    """Median extra communication time of the victims over the culprit, ms/step."""
    function: str | None
    """The communication function they wait in most."""


@dataclass
class SlowWorker:
    rank: int
    position: int
    group: int
    step_ms: float
    excess_ms: float
    non_wait_ms: float
    peers_non_wait_ms: float
    steps_outlying: int
    steps: int
    peer_count: int
    contributors: list[Contributor]
    categories: list[Contributor]
    root_category: str
    root_basis: str
    hardware: ResourceAnomaly | None = None
    victims: Victims | None = None
    cpu: CpuCause | None = None
    """What the rank did with its time, against its peers (HostUsage)."""
    intermittent: bool = False
    """Its excess recurs in some steps rather than in most."""
    excess_basis: ExcessBasis = "total"
    """How `excess_ms` was measured: its whole time outside communication against its peers'
    ("total"), the functions and categories that stand out ("outlying"), or its own extra
    computation by the CPU accounting ("cpu")."""
    mean_step_ms: float = 0.0
    """The rank's mean step over the window; `step_ms` is it, or the median step that a
    throttled rank's severity is a share of."""
    user_function: str | None = None
    """The user's own frame behind the top contributor (analyzer/signals/user_frame.py), when that
    contributor is a builtin, a library frame or an op."""

    @property
    def function(self) -> str | None:
        """The function the finding names: the user's frame where known."""
        if self.user_function is not None:
            return self.user_function
        if self.cpu is not None and self.cpu.kind in ("threads", "throttled", "starved"):
            return None  # the host or other threads: no function of the training thread
        return self.top.function if self.top else None

    @property
    def severity(self) -> float:
        return float(min(1.0, max(0.0, self.excess_ms / self.step_ms))) if self.step_ms else 0.0

    @property
    def top(self) -> Contributor | None:
        return self.contributors[0] if self.contributors else None


@dataclass
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


@dataclass
class Fusion:
    slow: list[SlowWorker] = field(default_factory=list)
    communication: list[CommOutlier] = field(default_factory=list)
    contended: list[Contended] = field(default_factory=list)
    """Suspects whose excess is waiting for a CPU on an oversubscribed host (not named)."""
    contended_notes: list[str] = field(default_factory=list)


def _finite(x: float) -> float | None:
    return round(float(x), 3) if np.isfinite(x) else None


def _contributor(features: Features, dev: Deviations, i: int, k: int) -> Contributor:
    step = float(features.mean_step_ms[i])
    ref = float(dev.ref[i, k])
    return Contributor(
        function=features.functions[k],
        category=features.categories[k],
        ms=float(features.ms[i, k]),
        peers_ms=ref,
        best_peer_ms=float(dev.best[i, k]),
        excess_ms=float(dev.excess_ms[i, k]),
        beta=float(features.ms[i, k] / step) if step else 0.0,
        peers_beta=ref / step if step else 0.0,
        robust_z=float(dev.z[i, k]),
        ratio=float(dev.ratio[i, k]),
        steps_outlying=int(dev.steps_outlying[i, k]),
        steps=int(dev.steps_valid[i, k]) or int(features.steps.counts[i]),
        outlying=bool(dev.outlying[i, k]),
    )


def fuse(
    features: Features,
    dev: Deviations,
    groups: PeerGroups,
    thresholds: Thresholds,
    anomalies: list[ResourceAnomaly],
    cpu: CpuWait | None = None,
    host: RankCpu | None = None,
    excluded: np.ndarray | None = None,
) -> Fusion:
    """`host`: the ranks' CPU accounting, when every rank has it (else `cpu`, the older
    per-function run share, judges contention)."""
    nw = features.non_wait_index
    wait = features.wait_index
    is_wait = features.waiting
    functions = (features.level == LEVEL_FUNCTION) & ~is_wait
    categories = (features.level == LEVEL_CATEGORY) & ~is_wait
    by_rank: dict[int, list[ResourceAnomaly]] = {}
    for anomaly in anomalies:
        by_rank.setdefault(anomaly.rank, []).append(anomaly)

    material = dev.excess_fraction[:, nw] >= thresholds.min_excess_fraction
    outlying_work = dev.outlying & (functions | categories)[None, :]
    waits_more = dev.excess_fraction[:, wait] >= thresholds.min_excess_fraction
    step = features.mean_step_ms
    # Extra work found function by function: on a busy host the non-wait total of every rank
    # is noisy, while a function its peers do not run (or run far less) stands out alone.
    work_excess = np.maximum(
        np.where(outlying_work & functions[None, :], np.maximum(dev.excess_ms, 0), 0).sum(1),
        np.where(outlying_work & categories[None, :], np.maximum(dev.excess_ms, 0), 0).sum(1),
    )
    material_work = work_excess >= thresholds.min_excess_fraction * step
    reference = np.ones(len(features.ranks), dtype=bool) if excluded is None else ~excluded
    if host is not None:
        # Waiting more in communication marks a victim, unless the rank also computes
        # materially longer than its peers (a second culprit waits for the first).
        works_more = host.on_cpu - _group_median(host.on_cpu, groups, reference)
        waits_more &= ~(works_more >= thresholds.min_excess_fraction * features.mean_step_ms)
    suspected = (material & (dev.outlying[:, nw] | outlying_work.any(axis=1))) | material_work
    computes_more: dict[int, CpuWork] = {}
    if host is not None and host.on_cpu_steps is not None:
        # Extra computation step by step, from the training thread's exact on-CPU time: on a
        # busy host the functions' wall times carry every rank's wait for a CPU and hide it.
        for i in range(len(features.ranks)):
            found = cpu_work_excess(
                host,
                i,
                _reference_peers(groups, reference, i),
                thresholds.min_excess_fraction * float(step[i]),
            )
            if found is not None:
                computes_more[i] = found
                suspected[i] = True
                # It computes longer step by step: what it waits more is for another culprit.
                waits_more[i] = False
    suspects = np.flatnonzero(suspected & ~waits_more)

    result = Fusion()
    for i in suspects.tolist():  # culprits: a handful of ranks, never all of them
        worker = _slow_worker(features, dev, groups, thresholds, i, nw, functions, categories)
        work = computes_more.get(i)
        if worker is None and work is not None:
            worker = _computing_worker(
                features, dev, groups, thresholds, i, work, functions, categories
            )
        if worker is None:
            continue
        peers = _reference_peers(groups, reference, i)
        material_ms = thresholds.min_excess_fraction * worker.step_ms
        unnamed = _exposed_by_shorter_gpu_work(worker, features, i, peers, material_ms)
        if unnamed is None and host is None:
            unnamed = _same_host_calls_slower(worker, features, functions, i, peers, thresholds)
        if unnamed is not None and work is None:
            result.contended_notes.append(f"rank {worker.rank}: {unnamed}; not named")
            continue
        if host is not None:
            gpu_ms = _gpu_excess(worker)
            cause = explain_excess(host, i, peers, worker.excess_ms, material_ms, gpu_ms)
            if cause.kind == "contended" and work is not None:
                # The functions' excess is mostly waiting for a CPU, but the rank does compute
                # longer: it is named for that, and only that.
                _with_cpu_work(worker, work, thresholds)
                cause = explain_excess(host, i, peers, worker.excess_ms, material_ms, gpu_ms)
            if cause.kind == "work" and host.on_cpu_steps is not None and work is None:
                # Its mean says it computes longer, but step by step it does not stand out
                # from its peers' own swings (work moving from rank to rank: imbalance).
                result.contended_notes.append(
                    f"rank {worker.rank}: its training thread computed "
                    f"{cause.evidence['on_cpu_ms_per_step']['rank']} ms/step against its "
                    f"peers' {cause.evidence['on_cpu_ms_per_step']['peers_median']}, but not "
                    "step by step beyond their own swings; not named"
                )
                continue
            if cause.kind == "contended":
                result.contended_notes.append(f"rank {worker.rank}: {cause.sentence}")
                continue
            stretched = (
                _stretched(worker, cause, features, functions, i, peers)
                if host.on_cpu_steps is not None
                else None
            )
            if stretched is None and cause.kind == "work" and work is not None:
                stretched = _same_calls_slower(features, functions, i, peers, work)
            if stretched is not None:
                result.contended_notes.append(f"rank {worker.rank}: {stretched}")
                continue
            engine = _autograd_excess(features, dev, functions, i)
            top = worker.top
            if top is not None and (top.function or "").startswith(AUTOGRAD):
                engine = (top.function or "", max(top.excess_ms, worker.excess_ms))
            if (
                cause.kind == "blocked"
                and engine is not None
                and engine[1] >= 0.5 * worker.excess_ms
            ):
                # Its extra blocking is inside the autograd engine (the top contributor, or a
                # category such as Python time holding it): a lock DDP's reducer waits on.
                result.contended_notes.append(
                    f"rank {worker.rank}: blocked {worker.excess_ms:.1f} ms/step longer than its "
                    f"peers, {engine[1]:.1f} of it inside {engine[0]}: data parallelism waits "
                    "for its gradient all-reduce there (a victim's wait, not the rank's work); "
                    "not named"
                )
                continue
            _with_cause(worker, cause, exact=host.on_cpu_steps is not None)
            if cause.kind == "work":
                _without_engine_wait(worker)
        else:
            top = worker.top
            comm = features.index_of(COMMUNICATION)
            if (
                top is not None
                and (top.function or "").startswith(AUTOGRAD)
                and comm is not None
                and float(features.ms[i, comm]) > 0
            ):
                # Without the CPU accounting (no host samples covered this window: a job over
                # before the sampler started, or bare Kineto traces), time inside the autograd
                # engine cannot be told from the wait for the gradient all-reduce in it.
                result.contended_notes.append(
                    f"rank {worker.rank}: {worker.excess_ms:.1f} ms/step longer than its peers "
                    f"inside {short(top.function)}, where data parallelism waits for its gradient "
                    "all-reduce; no CPU samples cover this window to tell work from that wait: "
                    "not named"
                )
                continue
            contended = (
                explained_by_contention(
                    cpu,
                    i,
                    peers,
                    worker.rank,
                    worker.step_ms,
                    worker.excess_ms,
                    thresholds.min_excess_fraction,
                )
                if cpu is not None
                else None
            )
            if contended is not None:
                result.contended.append(contended)
                continue
        _attribute(worker, by_rank.get(worker.rank, []))
        result.slow.append(worker)
    if host is not None:
        named = {w.position for w in result.slow}
        for i in range(len(features.ranks)):
            if i in named:
                continue
            peers = groups.members(int(groups.labels[i]))
            material_ms = thresholds.min_excess_fraction * float(step[i])
            # Throttled time is the cgroup's exact counter: a stall of the whole host inflates
            # the mean step, not the throttling, so it is weighed against the median step.
            typical_ms = thresholds.min_excess_fraction * float(features.steps.median_ms[i])
            held = held_back(host, i, peers, material_ms, min(material_ms, typical_ms))
            if held is not None:
                result.slow.append(_held_back_worker(features, dev, groups, i, held))
    slow_positions = {w.position for w in result.slow}
    for worker in result.slow:
        worker.victims = _victims(features, groups, worker, slow_positions)
    result.communication = communication_outliers(
        features, groups, dev, thresholds, result, by_rank
    )
    if host is not None and host.oversubscribed:
        result.communication = _without_contended_communication(
            result.communication, features, groups, host, result.contended_notes
        )
    return result


HOST_WORK = frozenset({"python", "cpu_op", "cuda_runtime", "dataloader", "gc"})
"""Finding categories of work a rank's host threads do (its CPU time, its launches)."""


def _exposed_by_shorter_gpu_work(
    worker: SlowWorker, features: Features, i: int, peers: np.ndarray, material_ms: float
) -> str | None:
    """Why a rank with more host work on its critical path is not named when its GPU work is
    shorter than its peers' by as much: where its kernels end sooner, the host work they
    overlapped on its peers shows on its own path instead (the critical path charges an
    instant to the GPU first). Its time outside communication in all is then no longer than
    theirs: it is a peer of a slower GPU, not a culprit (two ranks sharing one GPU, a peer
    whose kernels run longer). None when its GPU work is no shorter, or its total is longer."""
    if worker.root_category in GPU_WORK:
        return None
    others = peers[peers != i]
    if not len(others):
        return None
    deficit = 0.0
    for category in GPU_WORK:
        k = features.index_of(category)
        if k is not None:
            deficit += max(float(np.median(features.ms[others, k]) - features.ms[i, k]), 0.0)
    own = worker.non_wait_ms - worker.peers_non_wait_ms
    if own >= material_ms or deficit < 0.5 * worker.excess_ms:
        return None
    return (
        f"{worker.excess_ms:.1f} ms/step more {worker.root_category} on its critical path than "
        f"its peers, while its GPU work is {deficit:.1f} ms/step shorter than theirs and its time "
        f"outside communication in all {own:+.1f} ms/step against theirs: its host work shows "
        "where its kernels end sooner (the GPU is charged first), it is no extra work"
    )


def _same_host_calls_slower(
    worker: SlowWorker,
    features: Features,
    functions: np.ndarray,
    i: int,
    peers: np.ndarray,
    thresholds: Thresholds,
) -> str | None:
    """Without CPU samples (bare Kineto traces), why a rank whose extra time is host work spread
    over all its functions, in the same calls as its peers', is not named when the excess stays
    under twice the materiality threshold: the same calls each running a little longer on one
    host thread cannot then be told from a core it shares with busy threads or a slower clock
    (with samples, `_same_calls_slower` judges it from the thread's own CPU time). A rank that
    makes calls its peers do not, whose excess one function holds, or whose excess is GPU work,
    is judged as usual."""
    if worker.root_category not in HOST_WORK:
        return None
    if worker.severity >= 2 * thresholds.min_excess_fraction:
        return None
    held = max((c.excess_ms for c in worker.contributors if c.function is not None), default=0.0)
    if held >= HOLDS_SHARE * worker.excess_ms:
        return None
    share = _new_calls_share(features, functions, i, peers)
    if share is None or share >= NEW_CALLS_SHARE:
        return None
    return (
        f"{worker.excess_ms:.1f} ms/step ({worker.severity:.1%} of its step) longer than its "
        f"peers in {worker.root_category}, spread over its functions (none holds half), in the "
        "same calls as theirs "
        f"({share:.0%} of its extra time in calls they do not make); with no CPU samples this "
        "cannot be told from the same work running on a busier or slower core"
    )


def _gpu_excess(worker: SlowWorker) -> float:
    """The rank's GPU time (kernels, copies) beyond its peers', ms/step."""
    return sum(max(c.excess_ms, 0.0) for c in worker.categories if c.category in GPU_WORK)


def _stretched(
    worker: SlowWorker,
    cause: CpuCause,
    features: Features,
    functions: np.ndarray,
    i: int,
    peers: np.ndarray,
) -> str | None:
    """Why a rank that computes longer is not named when no function and no category holds
    its extra computation: the same work ran slower on its CPU (a core shared with other busy
    threads, a slower core), which is no work of its own. None when something holds it, or
    when its extra time is in calls its peers do not make (work of its own, however it spreads
    over Python, ops and kernel launches)."""
    if cause.kind != "work":
        return None
    share = _new_calls_share(features, functions, i, peers)
    if share is not None and share >= NEW_CALLS_SHARE:
        return None
    on_cpu = cause.evidence["on_cpu_ms_per_step"]
    if on_cpu["rank"] is None or on_cpu["peers_median"] is None:
        return None
    extra = float(on_cpu["rank"]) - float(on_cpu["peers_median"])
    # Functions' and categories' times are wall times (a busy host's waits inside them): they
    # are held against the rank's extra own time measured the same way.
    own = worker.non_wait_ms - worker.peers_non_wait_ms
    held = max((c.excess_ms for c in [*worker.contributors, *worker.categories]), default=0.0)
    if held >= HOLDS_SHARE * own:
        return None
    return (
        f"its training thread computed {extra:.1f} ms/step longer than its peers', spread over "
        f"all its work (of its {own:.1f} ms/step of extra own time, no function or category "
        f"holds half; at most {held:.1f}): "
        "the same work ran slower on its CPU (a core shared with other busy threads, or a "
        "slower core); not named"
    )


NEW_CALLS_SHARE = 0.25
"""Below this share of a rank's extra time in its functions spent in calls its peers do not make
(more calls of a function, or a function they do not run), the rank made the same calls as its
peers and they took longer. Healthy ranks sharing a busy host: at most 0.1 (fault suite, quiet
and loaded); a rank with injected work: 0.29 and more."""
SAME_CALLS_MIN_RATIO = 1.4
"""The same calls taking longer name a rank only when its training thread computes this much
longer than its peers in three steps of four (more work per call: a larger batch, a larger
model shard). Healthy ranks whose cores other busy threads share reach 1.31 (fault suite, quiet
and loaded; the healthy demo); a 3× batch keeps 1.48 and more."""


def _same_calls_slower(
    features: Features, functions: np.ndarray, i: int, peers: np.ndarray, work: CpuWork
) -> str | None:
    """Why a rank that computes longer is not named when its extra time is in the same calls
    as its peers' and is not steadily far above theirs: on a shared host which rank's work
    runs beside which other thread (caches, memory bandwidth, a sibling hyperthread) makes
    the same work slower on one rank for a while. None when it makes calls its peers do not,
    or computes steadily longer than that noise reaches."""
    if work.steady_ratio >= SAME_CALLS_MIN_RATIO:
        return None
    share = _new_calls_share(features, functions, i, peers)
    if share is None or share >= NEW_CALLS_SHARE:
        return None
    return (
        f"its training thread computed {work.on_cpu_ms - work.peers_on_cpu_ms:.1f} ms/step "
        f"longer than its peers', in the same calls as theirs (no function it calls more often "
        f"or alone), and by ×{work.steady_ratio:.2f} or less in a quarter of the steps: the same "
        "work ran slower on its CPU for a while (a core shared with other busy threads); "
        "not named"
    )


def _new_calls_share(
    features: Features, functions: np.ndarray, i: int, peers: np.ndarray
) -> float | None:
    """The share of rank i's extra time in its functions (over its peers' median) spent in
    calls its peers do not make: more calls of a function, or a function they do not run.
    None without call counts, peers or extra time."""
    calls = features.calls
    others = peers[peers != i]
    if calls is None or not len(others):
        return None
    own_ms, own_calls = features.ms[i, functions], calls[i, functions]
    peer_ms = np.median(features.ms[np.ix_(others, functions)], axis=0)
    peer_calls = np.median(calls[np.ix_(others, functions)], axis=0)
    extra = np.maximum(own_ms - peer_ms, 0.0)
    steps = max(int(features.steps.counts[i]), 1)
    # More than half a call over the window, beyond a 5% jitter (gc runs, retries).
    new_calls = own_calls > peer_calls * 1.05 + 0.5 / steps
    total = float(extra.sum())
    return float(extra[new_calls].sum()) / total if total > 0 else None


def _without_engine_wait(worker: SlowWorker) -> None:
    """A rank named for its work is not named for the time it waited inside the autograd
    engine (DDP's reducer blocks there for the gradient all-reduce): that contributor leaves,
    and the category holding it is counted without it for the root cause."""
    engine = [c for c in worker.contributors if (c.function or "").startswith(AUTOGRAD)]
    if not engine:
        return
    waited = {c.category: c.excess_ms for c in engine}
    rest = sorted(
        ((c.excess_ms - waited.get(c.category, 0.0), c) for c in worker.categories),
        key=lambda pair: -pair[0],
    )
    worked = [c for excess, c in rest if excess > 0 and not is_idle(c.category)]
    if not worked:
        return
    worker.contributors = [c for c in worker.contributors if c not in engine] or worked[:1]
    worker.root_category = finding_category(worked[0].category)


def _autograd_excess(
    features: Features, dev: Deviations, functions: np.ndarray, i: int
) -> tuple[str, float] | None:
    """The autograd engine's entry among the functions, and rank i's excess in it, ms/step."""
    for k in np.flatnonzero(functions).tolist():
        name = features.functions[k] or ""
        if name.startswith(AUTOGRAD):
            return name, float(dev.excess_ms[i, k])
    return None


def _reference_peers(groups: PeerGroups, reference: np.ndarray, i: int) -> np.ndarray:
    """Rank i's peer group, without the ranks already named (when that leaves a peer)."""
    peers = groups.members(int(groups.labels[i]))
    if reference[peers].sum() > 1:
        peers = peers[reference[peers] | (peers == i)]
    return peers


def _with_cpu_work(worker: SlowWorker, work: CpuWork, thresholds: Thresholds) -> None:
    worker.excess_ms = work.excess_ms
    worker.excess_basis = "cpu"
    worker.steps_outlying, worker.steps = work.steps_shown, work.steps
    worker.intermittent = work.steps_shown < thresholds.min_persistence * work.steps


def _computing_worker(
    features: Features,
    dev: Deviations,
    groups: PeerGroups,
    thresholds: Thresholds,
    i: int,
    work: CpuWork,
    functions: np.ndarray,
    categories: np.ndarray,
) -> SlowWorker | None:
    """A rank found by its extra on-CPU time alone: no function passed the peer comparison, so
    its contributors are the functions and categories whose time grew most."""
    grew = np.flatnonzero(functions & (dev.excess_ms[i] > 0))
    grew = grew[np.argsort(-dev.excess_ms[i, grew])]
    grew_categories = np.flatnonzero(categories & (dev.excess_ms[i] > 0))
    grew_categories = grew_categories[np.argsort(-dev.excess_ms[i, grew_categories])]
    contributors = [_contributor(features, dev, i, int(k)) for k in grew[:TOP_CONTRIBUTORS]]
    category_rows = [_contributor(features, dev, i, int(k)) for k in grew_categories]
    if not contributors:
        contributors = category_rows[:TOP_CONTRIBUTORS]
    if not contributors:
        return None
    nw = features.non_wait_index
    root = finding_category(
        features.categories[int(grew_categories[0])]
        if len(grew_categories)
        else contributors[0].category
    )
    if is_idle(root):
        root = "python"
    return SlowWorker(
        mean_step_ms=float(features.mean_step_ms[i]),
        rank=int(features.ranks[i]),
        position=i,
        group=int(groups.labels[i]),
        step_ms=float(features.mean_step_ms[i]),
        excess_ms=work.excess_ms,
        excess_basis="cpu",
        non_wait_ms=float(features.ms[i, nw]),
        peers_non_wait_ms=float(dev.ref[i, nw]),
        steps_outlying=work.steps_shown,
        steps=work.steps,
        peer_count=int(dev.peer_count[i]),
        contributors=contributors,
        categories=category_rows,
        root_category=root,
        root_basis=(
            f"its training thread computed {work.on_cpu_ms:.1f} ms/step against its peers' "
            f"{work.peers_on_cpu_ms:.1f} (on-CPU, step by step); category of the largest growth"
        ),
        intermittent=work.steps_shown < thresholds.min_persistence * work.steps,
    )


def _without_contended_communication(
    outliers: list[CommOutlier],
    features: Features,
    groups: PeerGroups,
    host: RankCpu,
    notes: list[str],
) -> list[CommOutlier]:
    """On an oversubscribed host a collective's threads wait for a CPU like any other: extra
    communication time that the rank's threads spent on the run queue is not a slower link."""
    kept = []
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
    return kept


def _group_median(values: np.ndarray, groups: PeerGroups, reference: np.ndarray) -> np.ndarray:
    """(R,) each rank's group median of `values` over the reference ranks."""
    out = np.full(len(values), np.nan)
    for group in range(len(groups.names)):
        members = groups.members(group)
        pool = members[reference[members]] if reference[members].any() else members
        out[members] = np.nanmedian(values[pool]) if len(pool) else np.nan
    return out


def _with_cause(worker: SlowWorker, cause: CpuCause, exact: bool = False) -> None:
    worker.cpu = cause
    # With exact per-step counters the rank's own time is measured, not estimated: its extra
    # computation (and its host's toll on it) is what it costs the job; the rest of its
    # functions' excess is waiting for a CPU, which names no rank. Off-CPU time is derived
    # (the step less the rest), so a blocked rank's excess is only capped by it.
    own = cause.own_ms if exact else None
    if own is not None and (
        cause.kind == "work" or (cause.kind == "blocked" and own < worker.excess_ms)
    ):
        worker.excess_ms = own
        worker.excess_basis = "cpu"
    if cause.kind in ("threads", "throttled", "starved"):
        worker.root_category = "host"
        worker.root_basis = cause.sentence
    elif cause.kind == "blocked":
        worker.root_basis = cause.sentence


def _held_back_worker(
    features: Features, dev: Deviations, groups: PeerGroups, i: int, cause: CpuCause
) -> SlowWorker:
    """A rank the host held back: its excess is the time it waited for a CPU or was throttled.
    A throttled rank's share is of its typical (median) step when stalls of the whole host
    make the mean longer: the quota costs it that share of every step it runs."""
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
    nw = features.non_wait_index
    return SlowWorker(
        mean_step_ms=float(features.mean_step_ms[i]),
        rank=int(features.ranks[i]),
        position=i,
        group=int(groups.labels[i]),
        step_ms=step,
        excess_ms=excess,
        non_wait_ms=float(features.ms[i, nw]),
        peers_non_wait_ms=float(dev.ref[i, nw]),
        steps_outlying=-1,
        steps=int(features.steps.counts[i]),
        peer_count=int(dev.peer_count[i]),
        contributors=[held],
        categories=[],
        root_category="host",
        root_basis=cause.sentence,
        cpu=cause,
    )


def _slow_worker(
    features: Features,
    dev: Deviations,
    groups: PeerGroups,
    thresholds: Thresholds,
    i: int,
    nw: int,
    functions: np.ndarray,
    categories: np.ndarray,
) -> SlowWorker | None:
    outlying_categories = np.flatnonzero(dev.outlying[i] & categories)
    outlying_functions = np.flatnonzero(dev.outlying[i] & functions)
    if dev.outlying[i, nw]:
        k = nw
        excess = float(dev.excess_ms[i, nw])
        steps_outlying, steps = int(dev.steps_outlying[i, nw]), int(dev.steps_valid[i, nw])
    else:
        # The non-wait total did not pass on its own (part of it was a one-off spike, or the
        # peers' totals are noisy on a busy host): count the outlying work, function by
        # function or category by category, whichever says more.
        excess = max(
            float(np.maximum(dev.excess_ms[i, outlying_categories], 0).sum()),
            float(np.maximum(dev.excess_ms[i, outlying_functions], 0).sum()),
        )
        best = outlying_categories if len(outlying_categories) else outlying_functions
        if not len(best):
            return None  # a suspect by its on-CPU time alone (_computing_worker)
        k = int(best[np.argmax(dev.excess_ms[i, best])])
        steps_outlying, steps = int(dev.steps_outlying[i, k]), int(dev.steps_valid[i, k])
    if excess <= 0:
        return None
    fn_order = outlying_functions[np.argsort(-dev.excess_ms[i, outlying_functions])]
    contributors = [_contributor(features, dev, i, int(k)) for k in fn_order[:TOP_CONTRIBUTORS]]
    step = float(features.mean_step_ms[i])
    shown = np.flatnonzero(categories & (dev.excess_ms[i] >= 0.01 * step))
    shown = shown[np.argsort(-dev.excess_ms[i, shown])]
    category_rows = [_contributor(features, dev, i, int(k)) for k in shown]
    if not contributors:
        contributors = [c for c in category_rows if c.outlying][:TOP_CONTRIBUTORS]
    if not contributors and dev.outlying[i, nw]:
        # The total is outlying, spread over functions none of which is alone: the categories
        # holding the excess are its contributors.
        contributors = [c for c in category_rows if c.excess_ms > 0][:TOP_CONTRIBUTORS]
    if not contributors:
        return None
    root_k = (
        int(outlying_categories[np.argmax(dev.excess_ms[i, outlying_categories])])
        if len(outlying_categories)
        else None
    )
    root = finding_category(
        features.categories[root_k] if root_k is not None else contributors[0].category
    )
    basis = "category of the largest contributor to the excess; no hardware samples say otherwise"
    if is_idle(root):
        root = "python"
        basis = (
            f"{UNATTRIBUTED} on this rank (no profiled op ran); Python code between ops is the "
            "usual cause — capture with Python stacks to name the function"
        )
    return SlowWorker(
        mean_step_ms=float(features.mean_step_ms[i]),
        rank=int(features.ranks[i]),
        position=i,
        group=int(groups.labels[i]),
        step_ms=step,
        excess_ms=excess,
        excess_basis="total" if k == nw else "outlying",
        non_wait_ms=float(features.ms[i, nw]),
        peers_non_wait_ms=float(dev.ref[i, nw]),
        steps_outlying=steps_outlying,
        steps=steps,
        peer_count=int(dev.peer_count[i]),
        contributors=contributors,
        categories=category_rows,
        root_category=root,
        root_basis=basis,
        intermittent=bool(dev.intermittent is not None and dev.intermittent[i, k]),
    )


def _attribute(worker: SlowWorker, anomalies: list[ResourceAnomaly]) -> None:
    """Abnormal resource μ/σ behind a contributor → the cause is hardware (docs/design.md §4)."""
    if not anomalies:
        return
    for contributor in worker.contributors:
        for anomaly in anomalies:
            if (anomaly.function, anomaly.category) == (contributor.function, contributor.category):
                worker.hardware = anomaly
                worker.root_category = anomaly.hardware_category
                worker.root_basis = f"{anomaly.describe()} in {short(anomaly.function)}: abnormal resource, not code"
                return


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


def communication_outliers(
    features: Features,
    groups: PeerGroups,
    dev: Deviations,
    thresholds: Thresholds,
    fusion: Fusion,
    anomalies: dict[int, list[ResourceAnomaly]],
) -> list[CommOutlier]:
    """Ranks with outlying communication time that no culprit and no peer's work explains.

    In a synchronous collective every rank leaves at the same time, so extra communication on a
    rank normally means it arrived early — its peers work longer (the rank is a victim). What is
    left after subtracting that is the rank's own slowness in communication (a slow link, a
    collective only it runs).
    """
    comm, nw = features.wait_index, features.non_wait_index
    explained_by_culprit = {r for w in fusion.slow for r in (w.victims.ranks if w.victims else [])}
    outliers = []
    for i in np.flatnonzero(dev.outlying[:, comm]).tolist():
        rank = int(features.ranks[i])
        if rank in explained_by_culprit or any(w.position == i for w in fusion.slow):
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
            top = _contributor(features, dev, i, k)
        hardware = next((a for a in anomalies.get(rank, []) if a.category == COMMUNICATION), None)
        outliers.append(
            CommOutlier(
                rank=rank,
                step_ms=step,
                excess_ms=float(dev.excess_ms[i, comm]),
                unexplained_ms=unexplained,
                contributor=_contributor(features, dev, i, comm),
                top_function=top,
                hardware=hardware,
            )
        )
    return outliers
