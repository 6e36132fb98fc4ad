"""Whether a suspect is named, and why not (analyzer/findings/fusion.py).

A suspect spends longer outside communication than its peers; it is named only for time that is
its own. Its extra time is not its own when it is host work shown where its kernels end sooner,
waiting for a CPU on a busy host (its CPU cause is `contended`), the same work running slower
on a shared core, or a wait inside the autograd engine for the gradient all-reduce. Each of
these rules keeps the rank out of the findings with a note that says why. A rank that is named
carries its CPU cause (analyzer/signals/cpu_cause.py), and its excess as the CPU accounting
measures it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from perfdiag.analyzer.compare.features import Features, finding_category, is_idle
from perfdiag.analyzer.findings.slow_worker import SlowWorker
from perfdiag.analyzer.findings.suspects import Suspect
from perfdiag.analyzer.signals.contention import Contended, explained_by_contention
from perfdiag.analyzer.signals.cpu_cause import (
    GPU_WORK,
    CpuCause,
    CpuWork,
    PeerCpu,
    explain_excess,
)
from perfdiag.analyzer.text import cuda_call_kind, short
from perfdiag.api.taxonomy import COMMUNICATION
from perfdiag.api.thresholds import Thresholds

HOLDS_SHARE = 0.5
"""A rank found computing longer is named when one function or category holds this share of
its extra own time (wall time outside communication, as functions are measured)."""
AUTOGRAD = "<built-in method run_backward of "
"""The autograd engine's entry: DDP's reducer waits inside it for the gradient all-reduce, so
time a rank is blocked (off-CPU) there is waiting for communication, not its own."""
HOST_WORK = frozenset({"python", "cpu_op", "cuda_runtime", "dataloader", "gc"})
"""Finding categories of work a rank's host threads do (its CPU time, its launches)."""
NEW_CALLS_SHARE = 0.25
"""Below this share of a rank's extra time in its functions spent in calls its peers do not make
(more calls of a function, or a function they do not run), the rank made the same calls as its
peers and they took longer. Healthy ranks sharing a busy host: at most 0.1 (fault suite, quiet
and loaded); a rank with injected work: 0.29 and more."""
MORE_WORK_FLOOR_RATIO = 1.5
"""A rank whose extra computation is spread over its work, or in the same calls as its peers',
does more work per call (a larger batch, a larger model shard) rather than the same work on a
slower CPU when its least on-CPU time in a step is this many times its peers' least
(`CpuWork.floor_ratio`): more work per call is in every step, its best included, while a core
shared with busy threads slows a healthy rank for stretches of steps, not in its best one.
Fault suite, quiet and loaded: a 3x batch 1.44-1.93 (10 runs; at 1.44 it is named by the calls
it makes more often, `_extra_in_called_more`); healthy ranks found computing
longer 1.03-1.18, every healthy rank at most 1.38. The lower quartile of its per-step ratio
does not tell them apart: 1.14 for a 3x batch whose peers' median switched between their fast
and slow steps, 1.21 for a healthy rank."""


@dataclass(frozen=True)
class NotNamed:
    """A suspect that is not named, and why."""

    rank: int
    reason: str

    @property
    def note(self) -> str:
        """For the verdict's notes."""
        return f"rank {self.rank}: {self.reason}"


def name_suspect(suspect: Suspect, worker: SlowWorker) -> SlowWorker | NotNamed | Contended:
    """The suspect's worker as its finding names it, or why it is not named: a note, or
    (without CPU accounting) the contention record of a rank whose excess is waiting for a
    CPU."""
    # A rank exposed by its peers' longer kernels is no slower in all, whatever its threads
    # computed meanwhile: extra CPU work hidden behind a peer's GPU time costs the job nothing
    # (bf16 autocast's casts on a rank whose peer runs fp32 kernels).
    exposed = _exposed_by_shorter_gpu_work(suspect, worker)
    if exposed is not None:
        return NotNamed(worker.rank, f"{exposed}; not named")
    if suspect.host is None and suspect.work is None:
        same_calls = _same_host_calls_slower(suspect, worker)
        if same_calls is not None:
            return NotNamed(worker.rank, f"{same_calls}; not named")
    if suspect.host is None:
        return _without_cpu_accounting(suspect, worker)
    return _by_cpu_accounting(suspect, suspect.host, worker)


def _by_cpu_accounting(
    suspect: Suspect, against: PeerCpu, worker: SlowWorker
) -> SlowWorker | NotNamed:
    cause = explain_excess(against, worker.excess_ms, _gpu_excess(worker), suspect.work)
    if cause.work is not None:
        worker = _with_cpu_work(worker, cause.work, suspect.context.thresholds)
    exact = against.cpu.on_cpu_steps is not None
    reason = _not_its_own_work(suspect, worker, cause, exact)
    # Extra work in the calls a rank shares with its peers (spread over them, or the same
    # calls each longer) is put down neither to a shared core nor to more work per call when
    # the rank also synchronizes with its GPU where they do not: each such call leaves its
    # other work unoverlapped (_led_by_sync). A rank whose excess no rule keeps out and that
    # makes calls of its own is named as usual, synchronizing or not.
    spread = reason is not None or (
        suspect.work is not None and _same_calls_share(suspect) is not None
    )
    sync = _new_sync_calls(suspect) if spread and cause.kind == "work" else None
    if reason is not None and sync is None:
        return NotNamed(worker.rank, reason)
    worker = _with_cause(worker, cause, exact)
    if cause.kind != "work":
        return worker
    worker = _without_engine_wait(worker)
    return worker if sync is None else _led_by_sync(worker, *sync)


def _not_its_own_work(
    suspect: Suspect, worker: SlowWorker, cause: CpuCause, exact: bool
) -> str | None:
    """Why the CPU accounting does not name the rank; None when it does. `exact`: every rank
    has exact per-step counters."""
    if cause.kind == "work" and exact and suspect.work is None:
        # Its mean says it computes longer, but step by step it does not stand out from its
        # peers' own swings (work moving from rank to rank: imbalance).
        on_cpu = cause.evidence["on_cpu_ms_per_step"]
        return (
            f"its training thread computed {on_cpu['rank']} ms/step against its peers' "
            f"{on_cpu['peers_median']}, but not step by step beyond their own swings; not named"
        )
    if cause.kind == "contended":
        return cause.sentence
    stretched = _stretched(suspect, worker, cause) if exact else None
    if stretched is None and cause.kind == "work" and suspect.work is not None:
        stretched = _same_calls_slower(suspect, suspect.work)
    if stretched is not None:
        return stretched
    return _blocked_in_autograd_engine(suspect, worker, cause)


def _without_cpu_accounting(
    suspect: Suspect, worker: SlowWorker
) -> SlowWorker | NotNamed | Contended:
    features = suspect.context.features
    top = worker.top
    comm = features.index_of(COMMUNICATION)
    if (
        top is not None
        and (top.function or "").startswith(AUTOGRAD)
        and comm is not None
        and float(features.ms[suspect.position, comm]) > 0
    ):
        # Without the CPU accounting (no host samples covered this window: a job over before
        # the sampler started, or bare Kineto traces), time inside the autograd engine cannot
        # be told from the wait for the gradient all-reduce in it.
        return NotNamed(
            worker.rank,
            f"{worker.excess_ms:.1f} ms/step longer than its peers inside "
            f"{short(top.function)}, where data parallelism waits for its gradient all-reduce; "
            "no CPU samples cover this window to tell work from that wait: not named",
        )
    cpu = suspect.context.cpu
    contended = (
        explained_by_contention(
            cpu,
            suspect.position,
            suspect.peers,
            worker.rank,
            worker.step_ms,
            worker.excess_ms,
            suspect.context.thresholds.min_excess_fraction,
        )
        if cpu is not None
        else None
    )
    return worker if contended is None else contended


def _exposed_by_shorter_gpu_work(suspect: Suspect, worker: SlowWorker) -> str | None:
    """Why a rank with more host work on its critical path is not named when its GPU work is
    shorter than its peers' by as much: where its kernels end sooner, the host work they
    overlapped on its peers shows on its own path instead (the critical path charges an
    instant to the GPU first). Its time outside communication in all is then no longer than
    theirs: it is a peer of a slower GPU, not a culprit (two ranks sharing one GPU, a peer
    whose kernels run longer). None when its GPU work is no shorter, or its total is longer."""
    if worker.root_category in GPU_WORK:
        return None
    features, i = suspect.context.features, suspect.position
    others = suspect.peers[suspect.peers != i]
    if not len(others):
        return None
    deficit = 0.0
    for category in GPU_WORK:
        k = features.index_of(category)
        if k is not None:
            deficit += max(float(np.median(features.ms[others, k]) - features.ms[i, k]), 0.0)
    own = worker.own_excess_ms
    if own >= suspect.material_ms or deficit < 0.5 * worker.excess_ms:
        return None
    return (
        f"{worker.excess_ms:.1f} ms/step more {worker.root_category} on its critical path than "
        f"its peers, while its GPU work is {deficit:.1f} ms/step shorter than theirs and its time "
        f"outside communication in all {own:+.1f} ms/step against theirs: its host work shows "
        "where its kernels end sooner (the GPU is charged first), it is no extra work"
    )


def _same_host_calls_slower(suspect: Suspect, worker: SlowWorker) -> str | None:
    """Without CPU samples (bare Kineto traces), why a rank whose extra time is host work spread
    over all its functions, in the same calls as its peers', is not named when the excess stays
    under twice the materiality threshold: the same calls each running a little longer on one
    host thread cannot then be told from a core it shares with busy threads or a slower clock
    (with samples, `_same_calls_slower` judges it from the thread's own CPU time). A rank that
    makes calls its peers do not, whose excess one function holds, or whose excess is GPU work,
    is judged as usual."""
    if worker.root_category not in HOST_WORK:
        return None
    if worker.severity >= 2 * suspect.context.thresholds.min_excess_fraction:
        return None
    held = max((c.excess_ms for c in worker.contributors if c.function is not None), default=0.0)
    share = _same_calls_share(suspect)
    if held >= HOLDS_SHARE * worker.excess_ms or share is None:
        return None
    return (
        f"{worker.excess_ms:.1f} ms/step ({worker.severity:.1%} of its step) longer than its "
        f"peers in {worker.root_category}, spread over its functions (none holds half), in the "
        "same calls as theirs "
        f"({share:.0%} of its extra time in calls they do not make); with no CPU samples this "
        "cannot be told from the same work running on a busier or slower core"
    )


def _new_sync_calls(suspect: Suspect) -> tuple[str, float, float] | None:
    """The host-device synchronization (cudaDeviceSynchronize, `.item()`, …) that the rank
    makes more often than its peers, most calls first: (function, its calls and its peers'
    median calls per step); None when it makes none they do not. Each such call drains the
    GPU's queue and holds the host until it is empty, so the rank's other work runs
    unoverlapped around it: its cost shows in the calls it shares with its peers, not in
    the synchronization's own time."""
    features, i = suspect.context.features, suspect.position
    calls = features.calls
    others = suspect.peers[suspect.peers != i]
    if calls is None or not len(others):
        return None
    found: list[tuple[float, str, float]] = []
    for k in np.flatnonzero(suspect.context.functions):
        name = features.functions[int(k)]
        if name is None or cuda_call_kind(name) != "sync":
            continue
        own, peers = float(calls[i, k]), float(np.median(calls[others, k]))  # per step
        # A call a step more than its peers, beyond their jitter.
        if own > peers * 1.05 + 1:
            found.append((own, name, peers))
    if not found:
        return None
    per_step, name, peers_per_step = max(found)
    return name, per_step, peers_per_step


def _led_by_sync(
    worker: SlowWorker, function: str, per_step: float, peers_per_step: float
) -> SlowWorker:
    """The worker named for the synchronization that sets it apart from its peers. Its
    excess is at most its whole extra time outside communication: the CPU accounting counts
    its PyTorch threads' extra CPU beside its training thread's, which overlap."""
    if 0 < worker.own_excess_ms < worker.excess_ms:
        worker = replace(worker, excess_ms=worker.own_excess_ms, excess_basis="total")
    return replace(
        worker,
        root_category="cuda_runtime",
        cause_function=function,
        root_basis=(
            f"it synchronizes the host with the GPU {per_step:.0f} times a step in "
            f"{short(function)}, its peers {peers_per_step:.0f}: each drains the GPU's queue and "
            "holds the host until it is empty, so its other work runs unoverlapped around it"
        ),
    )


def _gpu_excess(worker: SlowWorker) -> float:
    """The rank's GPU time (kernels, copies) beyond its peers', ms/step."""
    return sum(max(c.excess_ms, 0.0) for c in worker.categories if c.category in GPU_WORK)


def _stretched(suspect: Suspect, worker: SlowWorker, cause: CpuCause) -> str | None:
    """Why a rank that computes longer is not named when no function and no category holds
    its extra computation: the same work ran slower on its CPU (a core shared with other busy
    threads, a slower core), which is no work of its own. None when something holds it, or
    when its extra time is in calls its peers do not make (work of its own, however it spreads
    over Python, ops and kernel launches), or when even its best step computes far longer
    than its peers' best (more work per call, `MORE_WORK_FLOOR_RATIO`)."""
    if cause.kind != "work" or _more_work_per_call(suspect.work):
        return None
    share = _new_calls_share(suspect)
    if share is not None and share >= NEW_CALLS_SHARE:
        return None
    on_cpu = cause.evidence["on_cpu_ms_per_step"]
    if on_cpu["rank"] is None or on_cpu["peers_median"] is None:
        return None
    extra = float(on_cpu["rank"]) - float(on_cpu["peers_median"])
    # Functions' and categories' times are wall times (a busy host's waits inside them): they
    # are held against the rank's extra own time measured the same way.
    own = worker.own_excess_ms
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


def _same_calls_slower(suspect: Suspect, work: CpuWork) -> str | None:
    """Why a rank that computes longer is not named when its extra time is in the same calls
    as its peers' and its best step is not far above theirs: on a shared host which rank's
    work runs beside which other thread (caches, memory bandwidth, a sibling hyperthread)
    makes the same work slower on one rank for a while, never in all its steps. None when it
    makes calls its peers do not, or computes longer even in its best step."""
    if _more_work_per_call(work) or _same_calls_share(suspect) is None:
        return None
    return (
        f"its training thread computed {work.on_cpu_ms - work.peers_on_cpu_ms:.1f} ms/step "
        f"longer than its peers', in the same calls as theirs (no function it calls more often "
        f"or alone), and in its best step ×{work.floor_ratio:.2f} their best: the same work ran "
        "slower on its CPU for a while (a core shared with other busy threads); not named"
    )


def _more_work_per_call(work: CpuWork | None) -> bool:
    """Whether the rank computes far longer than its peers even in its best step."""
    return work is not None and work.floor_ratio >= MORE_WORK_FLOOR_RATIO


def _same_calls_share(suspect: Suspect) -> float | None:
    """The share of its extra time in calls its peers do not make, when it is too small for
    calls of its own (the rank made the same calls as its peers, and they took longer); None
    when it is not, or without call counts, peers or extra time."""
    share = _new_calls_share(suspect)
    return share if share is not None and share < NEW_CALLS_SHARE else None


def _new_calls_share(suspect: Suspect) -> float | None:
    """The share of the rank's extra time in its functions (over its peers' median) spent in
    calls its peers do not make: more calls of a function, or a function they do not run.
    None without call counts, peers or extra time."""
    features, functions, i = suspect.context.features, suspect.context.functions, suspect.position
    calls = features.calls
    others = suspect.peers[suspect.peers != i]
    if calls is None or not len(others):
        return None
    own_ms, own_calls = features.ms[i, functions], calls[i, functions]
    peer_ms = np.median(features.ms[np.ix_(others, functions)], axis=0)
    peer_calls = np.median(calls[np.ix_(others, functions)], axis=0)
    extra = np.maximum(own_ms - peer_ms, 0.0)
    steps = max(int(features.steps.counts[i]), 1)
    total = float(extra.sum())
    if total <= 0:
        return None
    in_new_calls = max(
        float(extra[_more_calls(own_calls, peer_calls, steps)].sum()),
        _extra_in_called_more(features, i, others, steps),
    )
    return min(in_new_calls / total, 1.0)


def _more_calls(
    own: NDArray[np.floating[Any]], peers: NDArray[np.floating[Any]], steps: int
) -> NDArray[np.bool_]:
    """The functions the rank calls more often than its peers: more than half a call over the
    window, beyond a 5% jitter (gc runs, retries)."""
    more: NDArray[np.bool_] = own > peers * 1.05 + 0.5 / steps
    return more


def _extra_in_called_more(
    features: Features, i: int, others: NDArray[np.int64], steps: int
) -> float:
    """The rank's largest extra inclusive time, ms/step, in one function it calls more often
    than its peers: the extra calls' work may be charged to what they run, under a caller
    called as often (a dataset's `__getitem__` called for a larger batch, its time in the
    ops it runs and the loader's list comprehension). The largest, not the sum: such
    functions nest. 0 without inclusive times."""
    ms, calls = features.inclusive_ms, features.inclusive_calls
    if ms is None or calls is None or not ms.shape[1]:
        return 0.0
    peer_ms = np.median(ms[others], axis=0)
    more = _more_calls(calls[i], np.median(calls[others], axis=0), steps)
    grew = np.maximum(ms[i] - peer_ms, 0.0)
    return float(grew[more].max()) if more.any() else 0.0


def _blocked_in_autograd_engine(
    suspect: Suspect, worker: SlowWorker, cause: CpuCause
) -> str | None:
    """Why a rank blocked longer than its peers is not named when at least half of that is
    inside the autograd engine (the top contributor, or a category such as Python time
    holding it): a lock DDP's reducer waits on for the gradient all-reduce."""
    if cause.kind != "blocked":
        return None
    engine = _autograd_excess(suspect)
    top = worker.top
    if top is not None and (top.function or "").startswith(AUTOGRAD):
        engine = (top.function or "", max(top.excess_ms, worker.excess_ms))
    if engine is not None and engine[1] >= 0.5 * worker.excess_ms:
        return (
            f"blocked {worker.excess_ms:.1f} ms/step longer than its peers, {engine[1]:.1f} of "
            f"it inside {engine[0]}: data parallelism waits for its gradient all-reduce there "
            "(a victim's wait, not the rank's work); not named"
        )
    return None


def _autograd_excess(suspect: Suspect) -> tuple[str, float] | None:
    """The autograd engine's entry among the functions, and the rank's excess in it, ms/step."""
    features = suspect.context.features
    for k in np.flatnonzero(suspect.context.functions).tolist():
        name = features.functions[k] or ""
        if name.startswith(AUTOGRAD):
            return name, float(suspect.context.dev.excess_ms[suspect.position, k])
    return None


def _with_cpu_work(worker: SlowWorker, work: CpuWork, thresholds: Thresholds) -> SlowWorker:
    """The worker counted by its extra computation step by step alone."""
    return replace(
        worker,
        excess_ms=work.excess_ms,
        excess_basis="cpu",
        steps_outlying=work.steps_shown,
        steps=work.steps,
        intermittent=work.steps_shown < thresholds.min_persistence * work.steps,
    )


def _with_cause(worker: SlowWorker, cause: CpuCause, exact: bool) -> SlowWorker:
    worker = replace(worker, cpu=cause)
    # With exact per-step counters the rank's own time is measured, not estimated: its extra
    # computation (and its host's toll on it) is what it costs the job; the rest of its
    # functions' excess is waiting for a CPU, which names no rank. Off-CPU time is derived
    # (the step less the rest), so a blocked rank's excess is only capped by it.
    own = cause.own_ms if exact else None
    if own is not None and (
        cause.kind == "work" or (cause.kind == "blocked" and own < worker.excess_ms)
    ):
        worker = replace(worker, excess_ms=own, excess_basis="cpu")
    if cause.kind in ("threads", "throttled", "starved"):
        return replace(worker, root_category="host", root_basis=cause.sentence)
    if cause.kind == "blocked":
        return replace(worker, root_basis=cause.sentence)
    return worker


def _without_engine_wait(worker: SlowWorker) -> SlowWorker:
    """A rank named for its work is not named for the time it waited inside the autograd
    engine (DDP's reducer blocks there for the gradient all-reduce): that contributor leaves,
    and the category holding it is counted without it for the root cause."""
    engine = [c for c in worker.contributors if (c.function or "").startswith(AUTOGRAD)]
    if not engine:
        return worker
    waited = {c.category: c.excess_ms for c in engine}
    rest = sorted(
        ((c.excess_ms - waited.get(c.category, 0.0), c) for c in worker.categories),
        key=lambda pair: -pair[0],
    )
    worked = [c for excess, c in rest if excess > 0 and not is_idle(c.category)]
    if not worked:
        return worker
    return replace(
        worker,
        contributors=[c for c in worker.contributors if c not in engine] or worked[:1],
        root_category=finding_category(worked[0].category),
    )
