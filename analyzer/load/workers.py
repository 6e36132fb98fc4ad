"""Which workers were expected, which were analysed, which are missing or stuck.

Expected ranks: those passed by the caller, those with any file in the capture, and 0…W−1 when
the summaries state a world size W.

Stuck: a worker whose heartbeat kept coming while its training step stopped advancing —
`updated_unix − last_step_unix` in its status.json (or, when its stack dump was taken at the
same step, the dump's `time_unix` − last_step_unix) reaches the limit of `perfdiag.api.stall`
(max(stuck_after_seconds, stuck_after_steps × median step), at most its upper bound), whether
or not it produced a summary (a job can hang after its window). A worker whose heartbeats
stopped too is gone (crashed, evicted), i.e. missing. Which of the stuck workers hold the job
up is decided by analyzer/load/hang.py from their stack dumps (and Flight Recorder dumps).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from perfdiag.analyzer.load.capture import Capture
from perfdiag.analyzer.load.hang import HangDiagnosis, diagnose_hang, read_flight_recorder
from perfdiag.api.limits import MAX_RANKS, rank_problem
from perfdiag.api.ranks import rank_runs
from perfdiag.api.stall import (
    HEARTBEAT_STALE_S,
    RankProgress,
    StallPolicy,
    StuckRank,
    stuck_ranks,
)
from perfdiag.api.thresholds import Thresholds
from perfdiag.api.verdict import RankRange, WorkerInfo
from perfdiag.api.worker import WorkerStatus

STACK_FRAMES_QUOTED = 6

NO_FILE = "no file of this worker in the capture"
"""Why an expected rank is missing when the capture holds no file of it at all."""

NO_FILE_RANGE = "no file in the capture"
"""The same, for a range of ranks in verdict.json's `missing`."""


@dataclass(frozen=True)
class StuckWorker:
    rank: int
    step: int
    stalled_s: float
    phase: str
    stack: list[str] | None
    """Innermost frames of the main thread (innermost first), when a stack dump exists."""


@dataclass(frozen=True)
class WorkerAccount:
    expected: list[int]
    analysed: list[int]
    missing: dict[int, str]
    """Rank → why it is missing."""
    stuck: dict[int, StuckWorker]
    hang: HangDiagnosis | None = None
    notes: tuple[str, ...] = ()


def stall_policy(thresholds: Thresholds) -> StallPolicy:
    return StallPolicy(
        min_s=thresholds.stuck_after_seconds, step_factor=thresholds.stuck_after_steps
    )


def account_workers(
    capture: Capture,
    expected_ranks: list[int] | None,
    thresholds: Thresholds,
    median_step_ms: float | None,
) -> WorkerAccount:
    analysed = capture.ranks
    expected = set(analysed) | set(capture.statuses) | set(capture.unreadable)
    refused = sorted({r for r in expected_ranks or [] if rank_problem(r) is not None})
    expected |= set(expected_ranks or []) - set(refused)
    # Workers stating a world size above the limit were refused when read: what is left
    # allocates at most MAX_RANKS ranks, whatever a file claims.
    world_sizes = [
        m.world_size for m in capture.metas.values() if m.world_size and m.world_size > 0
    ]
    if world_sizes:
        expected |= set(range(min(max(world_sizes), MAX_RANKS)))
    step_s = (median_step_ms or 0.0) / 1000.0
    stall_limit = stall_policy(thresholds).limit_s(step_s or None)
    newest = max((s.updated_unix for s in capture.statuses.values()), default=None)
    progress = [
        RankProgress(
            rank, status.step, status.last_step_unix, _seen_unix(status, capture.stacks.get(rank))
        )
        for rank, status in capture.statuses.items()
        if rank in expected and status.phase != "failed"
    ]
    stalled = stuck_ranks(progress, stall_limit)
    if stalled and newest is not None:
        # During a hang, a rank whose heartbeats stopped too (frozen, or holding the GIL in
        # native code) is stuck as well: as of the newest heartbeat its step has not advanced.
        quiet = [
            item
            for item in progress
            if item.rank not in stalled
            and item.updated_unix is not None
            and newest - item.updated_unix > HEARTBEAT_STALE_S
        ]
        stalled.update(stuck_ranks(quiet, stall_limit, now=newest))

    missing: dict[int, str] = {}
    stuck: dict[int, StuckWorker] = {}
    for rank in sorted(stalled):
        stalled_status = capture.statuses[rank]
        stuck[rank] = StuckWorker(
            rank=rank,
            step=stalled_status.step,
            stalled_s=stalled[rank].stalled_s,
            phase=stalled_status.phase,
            stack=main_thread_frames(capture.stacks.get(rank)),
        )
    for rank in sorted(expected - set(analysed) - set(stuck)):
        status = capture.statuses.get(rank)
        if rank in capture.unreadable:
            what = "trace" if capture.kind == "kineto" else "summary"
            missing[rank] = f"{what} unreadable: {capture.unreadable[rank]}"
            continue
        if status is None:
            missing[rank] = NO_FILE
            continue
        if status.phase == "failed":
            missing[rank] = f"its window failed: {status.error or 'no reason given'}"
            continue
        detail = f"no summary; last status: phase {status.phase} at step {status.step}"
        if newest is not None and newest - status.updated_unix >= stall_limit:
            detail += (
                f", heartbeat stopped {newest - status.updated_unix:.0f} s before the newest "
                "one (process gone?)"
            )
        missing[rank] = detail
    hang, notes = _hang(capture, stalled)
    if refused:
        notes.insert(0, f"expected ranks ignored: {rank_problem(refused[-1])}")
    return WorkerAccount(
        expected=sorted(expected),
        analysed=analysed,
        missing=missing,
        stuck=stuck,
        hang=hang,
        notes=tuple(notes),
    )


def _seen_unix(status: WorkerStatus, dump: Any) -> float:
    """When the rank was last seen at its status' step. A stack dump taken at that same step
    is newer evidence than the status heartbeat (uploaded at most every few seconds, and no
    more to the capture once the stacks plan replaced it on the pods)."""
    if isinstance(dump, dict) and dump.get("step") == status.step:
        taken = dump.get("time_unix")
        if isinstance(taken, (int, float)) and math.isfinite(taken):
            return max(status.updated_unix, float(taken))
    return status.updated_unix


def _hang(
    capture: Capture, stalled: dict[int, StuckRank]
) -> tuple[HangDiagnosis | None, list[str]]:
    if not stalled:
        return None, []
    notes: list[str] = []
    recorders = {}
    for rank, data in capture.flight_recorders.items():
        try:
            recorders[rank] = read_flight_recorder(data)
        except Exception as exc:  # a foreign pickle: say so, diagnose from the stacks
            notes.append(f"rank {rank}: Flight Recorder dump ignored ({type(exc).__name__}: {exc})")
    dumps = capture.stacks or _innermost_frames(capture, stalled)
    diagnosis = diagnose_hang(stalled, dumps, recorders)
    if not capture.stacks and dumps:
        diagnosis.basis += " (no stack dump: the heartbeats' innermost frames only)"
    return diagnosis, notes


def _innermost_frames(capture: Capture, stalled: dict[int, StuckRank]) -> dict[int, Any]:
    """Without any stack dump, each stuck rank's `blocked_in` (its training thread's innermost
    frame, from the heartbeat) stands in for one."""
    dumps: dict[int, Any] = {}
    for rank in stalled:
        status = capture.statuses.get(rank)
        where = status.blocked_in if status is not None else None
        if where is not None:
            frames = [{"file": where.file, "line": where.line, "function": where.function}]
            if where.collective is not None:  # keep "waiting in <collective>" recognisable
                frames.insert(
                    0, {"file": "torch/distributed/", "line": 0, "function": where.collective}
                )
            dumps[rank] = {"rank": rank, "threads": [{"training": True, "frames": frames}]}
    return dumps


def main_thread_frames(dump: Any) -> list[str] | None:
    """The innermost frames of the main thread of a stacks.json dump (collector/hook/spool.py)."""
    if not isinstance(dump, dict):
        return None
    threads = dump.get("threads")
    if not isinstance(threads, list) or not threads:
        return None
    main = next(
        (t for t in threads if isinstance(t, dict) and t.get("name") == "MainThread"),
        threads[0],
    )
    frames = main.get("frames") if isinstance(main, dict) else None
    if not isinstance(frames, list):
        return None
    out = []
    # Dumps list frames outermost first (traceback order); quote the innermost.
    for frame in reversed(frames[-STACK_FRAMES_QUOTED:]):
        if isinstance(frame, dict):
            out.append(f"{frame.get('file')}:{frame.get('line')} {frame.get('function')}")
    return out


def worker_infos(capture: Capture, account: WorkerAccount) -> list[WorkerInfo]:
    """verdict.json's `workers`: a row per expected rank, except those with no file at all
    (missing_ranges), whose rows would say nothing but their rank."""
    infos = []
    for rank in account.expected:
        if account.missing.get(rank) == NO_FILE:
            continue
        meta = capture.metas.get(rank)
        status = capture.statuses.get(rank)
        host = (meta.host if meta else None) or (status.host if status else None)
        pod = (meta.pod if meta else None) or (status.pod if status else None)
        state = "stuck" if rank in account.stuck else "missing" if rank in account.missing else "ok"
        infos.append(WorkerInfo(rank=rank, host=host, pod=pod, state=state))
    return infos


def missing_ranges(account: WorkerAccount) -> list[RankRange]:
    """verdict.json's `missing`: the expected ranks with no file at all, as ranges. A world size
    of 100,000 stated by a 2-rank capture is one range, not 99,998 rows."""
    absent = (rank for rank, why in account.missing.items() if why == NO_FILE)
    return [
        RankRange(first=first, last=last, reason=NO_FILE_RANGE) for first, last in rank_runs(absent)
    ]
