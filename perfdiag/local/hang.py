"""Noticing and diagnosing a hang in `perfdiag run`, whatever phase the run is in.

`HangWatch.check()` reads the ranks' heartbeats at every poll, learns the median step time from
them (perfdiag.api.stall.StepClock) and raises `HangDetected` when a rank's step has not advanced
for the stall limit. `collect_stacks` then sends a `stacks` plan, waits for every live rank's
dump and puts the dumps and the ranks' progress into storage, where the analysis reads them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from perfdiag.api import Plan
from perfdiag.api.stall import (
    RankProgress,
    StallPolicy,
    StepClock,
    StuckRank,
    progress_from_mapping,
    stuck_ranks,
)
from perfdiag.api.worker import WorkerStatus
from perfdiag.collector.agent import blocked_in, upload_stacks
from perfdiag.collector.hook import spool
from perfdiag.local.progress import Progress
from perfdiag.storage import Storage, layout

EXIT_HANG = 7
"""`perfdiag run` / `demo` exit code: the training hung; the hang verdict was printed and the
training stopped."""
STACKS_WAIT_S = 15.0
"""How long to wait for the ranks' stack dumps (the hooks poll the plan every 0.5 s)."""
POLL_S = 0.2
CHECK_EVERY_S = 0.5


class HangDetected(Exception):
    def __init__(self, stuck: dict[int, StuckRank], limit_s: float) -> None:
        ranks = ", ".join(str(rank) for rank in sorted(stuck))
        super().__init__(f"rank(s) {ranks} stopped advancing")
        self.stuck = stuck
        self.limit_s = limit_s


def read_progress(spool_dir: Path) -> dict[int, RankProgress]:
    """Every rank's progress from its spool heartbeat."""
    found: dict[int, RankProgress] = {}
    for rank in spool.ranks_in(spool_dir):
        data = spool.read_json(spool.rank_dir(spool_dir, rank) / spool.HEARTBEAT)
        if isinstance(data, dict):
            found[rank] = progress_from_mapping(rank, data)
    return found


@dataclass
class HangWatch:
    spool_dir: Path
    policy: StallPolicy
    clock: StepClock = field(default_factory=StepClock)
    _next_check: float = 0.0

    def limit_s(self) -> float:
        return self.policy.limit_s(self.clock.median_step_s())

    def check(self, now: float | None = None) -> None:
        """Raise HangDetected when a live rank has not stepped for the stall limit (reads the
        heartbeats at most every CHECK_EVERY_S; they are written once a second)."""
        moment = time.monotonic()
        if moment < self._next_check:
            return
        self._next_check = moment + CHECK_EVERY_S
        progress = read_progress(self.spool_dir)
        self.clock.observe(progress.values())
        limit = self.limit_s()
        stuck = stuck_ranks(progress.values(), limit, time.time() if now is None else now)
        if stuck:
            raise HangDetected(stuck, limit)


def collect_stacks(
    spool_dir: Path,
    plan_path: Path,
    storage: Storage,
    progress: Progress,
    statuses: dict[int, WorkerStatus],
    *,
    write_plan_to_storage: bool,
    wait_s: float = STACKS_WAIT_S,
    training_alive: Callable[[], bool] = lambda: True,
) -> Plan:
    """Ask every rank for its stacks, wait for the dumps, and write each rank's stacks.json
    (Flight Recorder dump too, when there is one) and status.json (its progress as of now)."""
    plan = Plan.new(action="stacks", steps=1, timeout_s=max(wait_s * 4, 60.0))
    plan.write_atomic(plan_path)
    if write_plan_to_storage:
        storage.put_text(layout.PLAN, plan.to_json())
    ranks = [rank for rank, item in read_progress(spool_dir).items() if not item.exited]
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and training_alive():
        answered = [r for r in ranks if spool.stacks_file(spool_dir, r, plan.id).is_file()]
        if len(answered) == len(ranks):
            break
        progress.status(f"waiting for stack dumps: {len(answered)}/{len(ranks)} ranks answered…")
        time.sleep(POLL_S)
    silent = []
    for rank in ranks:
        if not upload_stacks(spool_dir, rank, plan.id, storage):
            silent.append(rank)
        _write_status(spool_dir, rank, storage, statuses.get(rank), plan.id)
    if silent:
        progress(
            f"no stack dump from rank(s) {', '.join(map(str, silent))} within {wait_s:.0f} s "
            "(their hook is not answering: a process frozen or holding the GIL)"
        )
    return plan


def _write_status(
    spool_dir: Path,
    rank: int,
    storage: Storage,
    previous: WorkerStatus | None,
    plan_id: str,
) -> None:
    """status.json with the rank's progress now; a processed window's outcome is kept."""
    beat = spool.read_json(spool.rank_dir(spool_dir, rank) / spool.HEARTBEAT)
    beat = beat if isinstance(beat, dict) else {}
    item = progress_from_mapping(rank, beat)
    host = beat.get("host")
    base = previous or WorkerStatus(rank=rank, plan_id=plan_id, updated_unix=time.time())
    status = base.model_copy(
        update={
            "host": base.host or (host if isinstance(host, str) else None),
            "step": item.step,
            "last_step_unix": item.last_step_unix,
            "updated_unix": item.updated_unix or time.time(),
            "blocked_in": blocked_in(beat),
        }
    )
    storage.put_text(layout.worker_key(rank, layout.STATUS), status.model_dump_json())
