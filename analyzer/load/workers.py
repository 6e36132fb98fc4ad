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
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from perfdiag.analyzer.load.capture import Capture
from perfdiag.analyzer.load.hang import HangDiagnosis, diagnose_hang, read_flight_recorder
from perfdiag.api.limits import MAX_RANKS, rank_problem
from perfdiag.api.stall import (
    HEARTBEAT_STALE_S,
    RankProgress,
    StallPolicy,
    StuckRank,
    stuck_ranks,
)
from perfdiag.api.thresholds import Thresholds
from perfdiag.api.verdict import MAX_WORKER_ROWS, RankRange, WorkerInfo, WorkerRange
from perfdiag.api.worker import WorkerStatus

Ints = NDArray[np.int64]

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


class MissingRanks(Mapping[int, str]):
    """Rank → why it is missing: the ranks with a reason of their own, and the expected ranks
    of which the capture holds no file at all (`absent`: NO_FILE), kept as an array (a job
    can claim 1,000,000 ranks of which a capture holds two)."""

    def __init__(self, reasons: dict[int, str], absent: Ints) -> None:
        self.reasons = reasons
        self.absent = absent

    def __getitem__(self, rank: int) -> str:
        if rank in self.reasons:
            return self.reasons[rank]
        at = int(np.searchsorted(self.absent, rank))
        if at < len(self.absent) and self.absent[at] == rank:
            return NO_FILE
        raise KeyError(rank)

    def __iter__(self) -> Iterator[int]:
        return iter(np.union1d(np.fromiter(self.reasons, np.int64), self.absent).tolist())

    def __len__(self) -> int:
        return len(self.reasons) + len(self.absent)

    def first(self, count: int) -> list[int]:
        """The `count` lowest missing ranks."""
        own = np.fromiter(sorted(self.reasons)[:count], np.int64)
        lowest: list[int] = np.union1d(own, self.absent[:count])[:count].tolist()
        return lowest


@dataclass(frozen=True)
class WorkerAccount:
    expected: Ints
    """Every expected rank, ascending."""
    analysed: Ints
    """The ranks with a summary analysed, ascending."""
    missing: MissingRanks
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
    claimed = np.asarray(expected_ranks or [], np.int64)
    refused = np.unique(claimed[(claimed < 0) | (claimed >= MAX_RANKS)])
    unreadable = np.fromiter(capture.unreadable, np.int64, len(capture.unreadable))
    parts = [analysed, capture.statuses.ranks, unreadable, np.setdiff1d(claimed, refused)]
    # Workers stating a world size above the limit were refused when read: what is left
    # allocates at most MAX_RANKS ranks, whatever a file claims.
    world_size = int(capture.metas.world_sizes().max(initial=0))
    if world_size > 0:
        parts.append(np.arange(min(world_size, MAX_RANKS), dtype=np.int64))
    expected = np.unique(np.concatenate(parts))
    step_s = (median_step_ms or 0.0) / 1000.0
    stall_limit = stall_policy(thresholds).limit_s(step_s or None)
    newest = capture.statuses.newest_unix()
    stalled = _stalled(capture, stall_limit, newest)
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
    not_analysed = np.setdiff1d(expected, analysed, assume_unique=True)
    not_analysed = not_analysed[~np.isin(not_analysed, np.fromiter(stuck, np.int64, len(stuck)))]
    with_status = np.isin(not_analysed, capture.statuses.ranks) | np.isin(not_analysed, unreadable)
    reasons = {
        rank: _missing_reason(capture, rank, newest, stall_limit)
        for rank in not_analysed[with_status].tolist()
    }
    hang, notes = _hang(capture, stalled)
    if len(refused):
        notes.insert(0, f"expected ranks ignored: {rank_problem(int(refused[-1]))}")
    return WorkerAccount(
        expected=expected,
        analysed=analysed,
        missing=MissingRanks(reasons, not_analysed[~with_status]),
        stuck=stuck,
        hang=hang,
        notes=tuple(notes),
    )


def _stalled(capture: Capture, limit_s: float, newest: float | None) -> dict[int, StuckRank]:
    """The ranks stuck by their status (perfdiag.api.stall), judged in bulk: only the ranks
    whose heartbeat shows a stall of at least the limit are looked at one by one."""
    columns = capture.statuses.columns
    live = ~capture.statuses.failed() & ~np.isnan(columns.last_step_unix)
    seen = columns.updated_unix.copy()
    with_dump = np.isin(columns.ranks, np.fromiter(capture.stacks, np.int64, len(capture.stacks)))
    for i in np.flatnonzero(with_dump).tolist():
        rank = int(columns.ranks[i])
        seen[i] = _seen_unix(capture.statuses[rank], capture.stacks.get(rank))

    def progress(mask: np.ndarray) -> list[RankProgress]:
        return [
            RankProgress(
                int(columns.ranks[i]),
                int(columns.step[i]),
                float(columns.last_step_unix[i]),
                float(seen[i]),
            )
            for i in np.flatnonzero(mask).tolist()
        ]

    stalled = stuck_ranks(progress(live & (seen - columns.last_step_unix >= limit_s)), limit_s)
    if stalled and newest is not None:
        # During a hang, a rank whose heartbeats stopped too (frozen, or holding the GIL in
        # native code) is stuck as well: as of the newest heartbeat its step has not advanced.
        quiet = live & ~np.isin(columns.ranks, np.fromiter(stalled, np.int64, len(stalled)))
        quiet &= (newest - seen > HEARTBEAT_STALE_S) & (newest - columns.last_step_unix >= limit_s)
        stalled.update(stuck_ranks(progress(quiet), limit_s, now=newest))
    return stalled


def _missing_reason(capture: Capture, rank: int, newest: float | None, stall_limit: float) -> str:
    """Why a rank of which the capture holds a file was not analysed."""
    if rank in capture.unreadable:
        what = "trace" if capture.kind == "kineto" else "summary"
        return f"{what} unreadable: {capture.unreadable[rank]}"
    status = capture.statuses.get(rank)
    if status is None:
        return NO_FILE
    if status.phase == "failed":
        return f"its window failed: {status.error or 'no reason given'}"
    detail = f"no summary; last status: phase {status.phase} at step {status.step}"
    if newest is not None and newest - status.updated_unix >= stall_limit:
        detail += (
            f", heartbeat stopped {newest - status.updated_unix:.0f} s before the newest "
            "one (process gone?)"
        )
    return detail


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


def worker_infos(
    capture: Capture, account: WorkerAccount, named: Sequence[int] = ()
) -> tuple[list[WorkerInfo], list[WorkerRange]]:
    """verdict.json's `workers`: a row per expected rank, except those with no file at all
    (missing_ranges), whose rows would say nothing but their rank. Beyond MAX_WORKER_ROWS such
    ranks, rows for the `named` ranks (what the findings name, most severe first) and those not
    ok, up to MAX_WORKER_ROWS; the others as `worker_ranges`."""
    listed = np.setdiff1d(account.expected, account.missing.absent, assume_unique=True)
    state = np.zeros(len(listed), np.int8)  # 0 ok, 1 missing, 2 stuck
    state[np.isin(listed, np.fromiter(account.missing.reasons, np.int64))] = 1
    state[np.isin(listed, np.fromiter(account.stuck, np.int64))] = 2
    rows = listed
    if len(listed) > MAX_WORKER_ROWS:
        rows = _rows_kept(listed, state, named)
    infos = [_info(capture, account, rank) for rank in rows.tolist()]
    ranged = ~np.isin(listed, rows)
    return infos, _ranges(listed[ranged], state[ranged])


def _rows_kept(listed: Ints, state: NDArray[np.int8], named: Sequence[int]) -> Ints:
    """The ranks with a row when not all can have one: named first, then stuck, then missing."""
    order = [np.asarray(named, np.int64), listed[state == 2], listed[state == 1]]
    chosen: list[int] = []
    seen: set[int] = set()
    for ranks in order:
        for rank in ranks[np.isin(ranks, listed)].tolist():
            if len(chosen) == MAX_WORKER_ROWS:
                break
            if rank not in seen:
                seen.add(rank)
                chosen.append(rank)
    return np.sort(np.asarray(chosen, np.int64))


def _ranges(ranks: Ints, state: NDArray[np.int8]) -> list[WorkerRange]:
    """Runs of consecutive ranks in one state."""
    if not len(ranks):
        return []
    breaks = np.flatnonzero((np.diff(ranks) != 1) | (np.diff(state) != 0)) + 1
    firsts = np.r_[0, breaks]
    lasts = np.r_[breaks - 1, len(ranks) - 1]
    names = ("ok", "missing", "stuck")
    return [
        WorkerRange(first=int(ranks[f]), last=int(ranks[last]), state=names[int(state[f])])
        for f, last in zip(firsts.tolist(), lasts.tolist(), strict=True)
    ]


def _info(capture: Capture, account: WorkerAccount, rank: int) -> WorkerInfo:
    meta = capture.metas.get(rank)
    status = capture.statuses.get(rank)
    host = (meta.host if meta else None) or (status.host if status else None)
    pod = (meta.pod if meta else None) or (status.pod if status else None)
    state = "stuck" if rank in account.stuck else "missing" if rank in account.missing else "ok"
    return WorkerInfo(rank=rank, host=host, pod=pod, state=state)


def missing_ranges(account: WorkerAccount) -> list[RankRange]:
    """verdict.json's `missing`: the expected ranks with no file at all, as ranges. A world size
    of 100,000 stated by a 2-rank capture is one range, not 99,998 rows."""
    absent = account.missing.absent
    if not len(absent):
        return []
    breaks = np.flatnonzero(np.diff(absent) != 1) + 1
    firsts, lasts = np.r_[0, breaks], np.r_[breaks - 1, len(absent) - 1]
    return [
        RankRange(first=int(absent[f]), last=int(absent[last]), reason=NO_FILE_RANGE)
        for f, last in zip(firsts.tolist(), lasts.tolist(), strict=True)
    ]
