"""Which workers were expected, which were analysed, which are missing or stuck.

Expected ranks: those passed by the caller, those with any file in the capture, and 0…W−1 when
the summaries state a world size W.

Stuck (v1, minimal): a worker without a summary whose heartbeat kept coming while its training
step stopped advancing — `updated_unix − last_step_unix` in its status.json exceeds
max(stuck_after_seconds, stuck_after_steps × median step). A worker whose heartbeats stopped
too is gone (crashed, evicted), i.e. missing. The full hang method (stack dumps grouped across
ranks, the rank outside the collective the others wait in) is a later issue; stacks.json, when
present, is quoted in the evidence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from perfdiag.analyzer.capture import Capture
from perfdiag.analyzer.thresholds import Thresholds
from perfdiag.api.verdict import WorkerInfo

STACK_FRAMES_QUOTED = 6


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


def account_workers(
    capture: Capture,
    expected_ranks: list[int] | None,
    thresholds: Thresholds,
    median_step_ms: float | None,
) -> WorkerAccount:
    analysed = capture.ranks
    expected = set(analysed) | set(capture.statuses) | set(capture.unreadable)
    expected |= set(expected_ranks or [])
    world_sizes = [m.world_size for m in capture.metas.values() if m.world_size]
    if world_sizes:
        expected |= set(range(max(world_sizes)))
    step_s = (median_step_ms or 0.0) / 1000.0
    stall_limit = max(thresholds.stuck_after_seconds, thresholds.stuck_after_steps * step_s)
    newest = max((s.updated_unix for s in capture.statuses.values()), default=None)

    missing: dict[int, str] = {}
    stuck: dict[int, StuckWorker] = {}
    for rank in sorted(expected - set(analysed)):
        status = capture.statuses.get(rank)
        if rank in capture.unreadable:
            missing[rank] = f"summary unreadable: {capture.unreadable[rank]}"
            continue
        if status is None:
            missing[rank] = "no file of this worker in the capture"
            continue
        if status.phase == "failed":
            missing[rank] = f"its window failed: {status.error or 'no reason given'}"
            continue
        if status.last_step_unix is not None:
            stalled = status.updated_unix - status.last_step_unix
            if stalled >= stall_limit:
                stuck[rank] = StuckWorker(
                    rank=rank,
                    step=status.step,
                    stalled_s=stalled,
                    phase=status.phase,
                    stack=main_thread_frames(capture.stacks.get(rank)),
                )
                continue
        detail = f"no summary; last status: phase {status.phase} at step {status.step}"
        if newest is not None and newest - status.updated_unix >= stall_limit:
            detail += (
                f", heartbeat stopped {newest - status.updated_unix:.0f} s before the newest "
                "one (process gone?)"
            )
        missing[rank] = detail
    return WorkerAccount(expected=sorted(expected), analysed=analysed, missing=missing, stuck=stuck)


def main_thread_frames(dump: Any) -> list[str] | None:
    """The innermost frames of the main thread of a stacks.json dump (collector/spool.py)."""
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
    infos = []
    for rank in account.expected:
        meta = capture.metas.get(rank)
        status = capture.statuses.get(rank)
        host = (meta.host if meta else None) or (status.host if status else None)
        pod = (meta.pod if meta else None) or (status.pod if status else None)
        state = "stuck" if rank in account.stuck else "missing" if rank in account.missing else "ok"
        infos.append(WorkerInfo(rank=rank, host=host, pod=pod, state=state))
    return infos
