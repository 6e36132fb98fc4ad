"""One capture window on this node's ranks: wait for the warm-up steps, write the plan, turn
each rank's window into its worker files as soon as the rank finishes it."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from perfdiag.api import Plan
from perfdiag.api.plan import start_step_ahead, watch_deadline
from perfdiag.api.stall import StallPolicy
from perfdiag.api.trigger import SlowdownRule
from perfdiag.api.worker import WorkerStatus
from perfdiag.collector.agent import process_window, window_complete
from perfdiag.collector.hardware import HardwareSampler, Series, gpu_index, worker_series
from perfdiag.collector.hook import spool
from perfdiag.local.first_step import (
    NO_STEP_NOTE_AFTER_S,
    no_rank_stepped_text,
    silent_ranks_text,
)
from perfdiag.local.heartbeats import RankBeat, read_beats, steps_text
from perfdiag.local.progress import Progress
from perfdiag.local.rank_processes import rank_processes
from perfdiag.storage import Storage, layout

POLL_S = 0.2
# When some ranks have reached the warm-up step, how long to wait for ranks that never wrote a
# heartbeat (their hook did not load) before capturing without them.
MISSING_RANK_GRACE_S = 60.0
# How long a plan takes to reach every rank (the hook polls every 0.5 s) plus how old the step
# counts in the heartbeats can be (one a second): the window begins this far ahead.
PLAN_LEAD_S = 2.0
RATE_WAIT_S = 3.0  # at most this long for a second heartbeat (the step rate) before the plan


class TrainingEnded(Exception):
    """The training exited while perfdiag was waiting (code = torchrun's exit code)."""

    def __init__(self, code: int) -> None:
        super().__init__(f"training exited with code {code}")
        self.code = code


class Interrupted(Exception):
    """The user asked to stop (Ctrl-C or SIGTERM, already forwarded to the training)."""


@dataclass
class WindowState:
    """What the window has produced so far."""

    plan: Plan | None = None
    ranks: list[int] = field(default_factory=list)
    world_size: int | None = None
    statuses: dict[int, WorkerStatus] = field(default_factory=dict)
    max_step_seen: int = 0
    plan_written_at: float | None = None
    # Each rank's last two distinct heartbeats, (time, step): the current step rate, which sets
    # the plan's start step.
    last_beats: dict[int, list[tuple[float, int]]] = field(default_factory=dict)

    def note_beat(self, rank: int, beat: RankBeat) -> None:
        if beat.updated_unix is None:
            return
        seen = self.last_beats.setdefault(rank, [])
        if not seen or beat.updated_unix > seen[-1][0]:
            seen.append((beat.updated_unix, beat.step))
            del seen[:-2]

    def steps_per_second(self) -> float | None:
        """The fastest rank's step rate over its last heartbeat interval; None before a rank
        has two heartbeats."""
        rates = [
            (b[1] - a[1]) / (b[0] - a[0])
            for a, b in (pair for pair in self.last_beats.values() if len(pair) == 2)
        ]
        return max(rates) if rates else None

    @property
    def missing(self) -> list[int]:
        return [rank for rank in self.ranks if rank not in self.statuses]

    def failures_text(self) -> str:
        failed = [
            f"rank {rank}: {status.error or status.phase}"
            for rank, status in sorted(self.statuses.items())
            if status.phase != "done"
        ]
        return "; ".join(failed) or "no window completed"

    @property
    def captured(self) -> list[int]:
        return [rank for rank, status in sorted(self.statuses.items()) if status.phase == "done"]


@dataclass
class WindowSettings:
    local_ranks: int
    warmup_steps: int
    capture_steps: int
    python_stacks: bool
    keep_raw: bool
    timeout_s: float
    write_plan_to_storage: bool = True
    stall: StallPolicy | None = field(default_factory=StallPolicy)
    """When a rank counts as stuck (perfdiag.api.stall); None: hang detection off."""
    sample_hardware: bool = True
    """Sample GPU (NVML) and host (/proc) metrics while the window is open."""
    trigger: SlowdownRule | None = None
    """Capture when the job slows down (perfdiag.api.slowdown), not after the warm-up steps."""
    max_captures: int = 1
    """With a trigger: how many windows to capture at most, one per slowdown."""


class WindowCoordinator:
    """Drives one window. `check` is called at every poll: it raises TrainingEnded when the
    training has exited and Interrupted when the user asked to stop."""

    def __init__(
        self,
        settings: WindowSettings,
        spool_dir: Path,
        plan_path: Path,
        storage: Storage,
        progress: Progress,
        check: Callable[[], None] = lambda: None,
    ) -> None:
        self.settings = settings
        self.spool_dir = spool_dir
        self.plan_path = plan_path
        self.storage = storage
        self.progress = progress
        self.check = check
        self.state = WindowState()
        self.sampler: HardwareSampler | None = None
        self.launcher_pid: int | None = None
        """torchrun's pid: its rank processes are sampled from the start when known."""

    # -- phase 1: the plan and the ranks ---------------------------------------------------

    @property
    def start_step(self) -> int:
        """The step after which every rank's window begins. The first step boundary a hook sees
        is the end of step 1, so 0 warm-up steps begins after step 1 too."""
        return max(1, self.settings.warmup_steps)

    def plan_at_start(self) -> Plan:
        """Before the ranks start: the plan names its start step, and each hook reads it at its
        first step boundary, so every rank profiles steps start+1 … start+capture+1 at any
        step rate (1 ms or 10 s a step). With a slowdown trigger, a `watch` plan instead: the
        hooks report their mean step time and nothing is captured until the rule fires."""
        if self.settings.trigger is not None:
            plan = watch_plan(self.settings.trigger)
            plan.write_atomic(self.plan_path)
            return plan
        return self._write_plan(self.start_step)

    def wait_for_ranks(self) -> None:
        """Return once every rank of this node reports (its hook loaded, a step done), or some
        do and the others have not for MISSING_RANK_GRACE_S; then sample their hardware."""
        started, first_seen = time.monotonic(), None
        noted = False
        while True:
            self.check()
            if self.settings.trigger is None:
                self._sample_rank_processes()
            beats = self.beats()
            now = time.monotonic()
            if beats and first_seen is None:
                first_seen = now
            if len(beats) >= self.settings.local_ranks:
                break
            if first_seen is not None and now - first_seen > MISSING_RANK_GRACE_S:
                silent = sorted(set(self._rank_pids()) - set(beats))
                steps = {rank: beat.step for rank, beat in beats.items()}
                self.progress(silent_ranks_text(steps, self.settings.local_ranks, silent))
                break
            if not noted and not beats and now - started > NO_STEP_NOTE_AFTER_S:
                noted = True  # a slow start looks the same as uncounted steps: say what is seen
                running = len(self._rank_pids()) if self.launcher_pid is not None else None
                self.progress(
                    no_rank_stepped_text(now - started, self.settings.local_ranks, running)
                )
            self.progress.status(
                f"waiting for {self.settings.local_ranks} ranks to start ({len(beats)} reporting)…"
            )
            time.sleep(POLL_S)
        self._adopt_ranks(beats)
        if self.settings.trigger is not None:
            return
        self._start_sampler()
        self.progress(f"{len(beats)} ranks running: {self._steps_text(self.start_step)}…")

    def _adopt_ranks(self, beats: dict[int, RankBeat]) -> None:
        self.state.ranks = sorted(beats)
        worlds = {beat.world_size for beat in beats.values() if beat.world_size}
        self.state.world_size = max(worlds) if worlds else len(beats)

    @property
    def last_step(self) -> int:
        """The step after which the planned window is complete (steps counted as the hook
        counts them: the window ends at the boundary after its last profiled step)."""
        plan = self.state.plan
        start = plan.start_step if plan is not None and plan.start_step is not None else 0
        return start + self.settings.capture_steps + 1

    def _steps_text(self, start: int) -> str:
        # Steps count from 0, as the trace's ProfilerStep#<n> and the verdict do.
        last = start + self.settings.capture_steps
        return f"every rank captures steps {start + 1}–{last} (step {start} warms the profiler up)"

    def after_training_exit(self) -> None:
        """The training exited: the ranks that reported are the window's (a fast job can end
        before perfdiag counted them), and every window they completed is taken."""
        beats = self.beats()  # their last heartbeats: how far the training got
        if not self.state.ranks:
            self._adopt_ranks(beats)
        try:
            self.process_completed()
        finally:
            self.stop_sampler()

    # -- phase 2: the window ----------------------------------------------------------------

    def capture_ahead(self, reason: str) -> Plan:
        """A window planned while the ranks run (the slowdown trigger): it begins PLAN_LEAD_S
        ahead at the fastest rank's step rate, so that every rank has the plan by then."""
        beats = self.beats()
        self._adopt_ranks(beats)
        rate = self.state.steps_per_second()
        waited_until = time.monotonic() + RATE_WAIT_S
        while rate is None and time.monotonic() < waited_until:
            self.check()  # the first heartbeats came within a second: wait for one more
            time.sleep(POLL_S)
            beats = self.beats() or beats
            rate = self.state.steps_per_second()
        start = start_step_ahead(max(b.step for b in beats.values()), rate, PLAN_LEAD_S)
        self._start_sampler()
        plan = self._write_plan(start)
        self.progress(f"{reason}: {self._steps_text(start)}…")
        return plan

    def _rank_pids(self) -> dict[int, int]:
        """rank → pid of this node's rank processes (empty when unknown)."""
        if self.launcher_pid is None:
            return {}
        return rank_processes(self.launcher_pid)

    def _sample_rank_processes(self) -> None:
        """Start sampling as soon as every rank process of this node exists: a fast job can
        finish its window before its first heartbeat is read (a window planned at start)."""
        if self.sampler is not None or self.launcher_pid is None:
            return
        if not self.settings.sample_hardware:
            return
        pids = rank_processes(self.launcher_pid)
        if len(pids) >= self.settings.local_ranks:
            self._start_sampler(pids)

    def _start_sampler(self, pids: dict[int, int] | None = None) -> None:
        """Hardware samples from now until every rank's window is processed."""
        if not self.settings.sample_hardware or self.sampler is not None:
            return
        if pids is None:
            pids = {}
            for rank in self.state.ranks:
                beat = spool.read_json(spool.rank_dir(self.spool_dir, rank) / spool.HEARTBEAT)
                pid = beat.get("pid") if isinstance(beat, dict) else None
                if isinstance(pid, int):
                    pids[rank] = pid
        self.sampler = HardwareSampler(pids=pids)
        for note in self.sampler.notes:
            self.progress(f"hardware sampler: {note}")
        self.sampler.start()

    def stop_sampler(self) -> None:
        sampler, self.sampler = self.sampler, None
        if sampler is not None:
            known = len(sampler.notes)
            sampler.stop()
            for note in sampler.notes[known:]:
                self.progress(f"hardware sampler: {note}")

    def _hardware_of(self, rank: int) -> list[Series] | None:
        if self.sampler is None:
            return None
        beat = read_beats(self.spool_dir).get(rank)
        gpu = gpu_index(beat.local_rank if beat else None)
        return worker_series(self.sampler.samples(), rank, gpu)

    def _write_plan(self, start_step: int) -> Plan:
        plan = Plan.new(
            steps=self.settings.capture_steps,
            python_stacks=self.settings.python_stacks,
            timeout_s=self.settings.timeout_s,
            start_step=start_step,
        )
        plan.write_atomic(self.plan_path)
        if self.settings.write_plan_to_storage:
            self.storage.put_text(layout.PLAN, plan.to_json())
        self.state.plan = plan
        self.state.plan_written_at = time.monotonic()
        return plan

    def collect(self) -> WindowState:
        """Process each rank's window as it completes, until all are done or --timeout passes.

        Raises TrainingEnded/Interrupted from `check`; the windows completed by then can still
        be processed (`process_completed`) and analyzed by the caller."""
        assert self.state.plan is not None and self.state.plan_written_at is not None
        deadline = self.state.plan_written_at + self.settings.timeout_s
        try:
            return self._collect(deadline)
        finally:
            self.stop_sampler()

    def _collect(self, deadline: float) -> WindowState:
        while True:
            self.process_completed()
            if not self.state.missing:
                self._report_misalignment()
                return self.state
            self.check()
            if time.monotonic() > deadline:
                self.progress(
                    f"the window did not complete within {self.settings.timeout_s:.0f} s on "
                    f"rank(s) {', '.join(map(str, self.state.missing))}"
                )
                self.record_missing("window not completed within --timeout")
                return self.state
            self.progress.status(self._capture_text())
            time.sleep(POLL_S)

    def _report_misalignment(self) -> None:
        """Say so when the ranks' windows did not begin at the same step: each hook picks the
        plan up on its own poll, and the late rank's window then holds its peers' trace export
        as waiting time (docs/design.md's synchronized window needs the plan to name a start step)."""
        plan = self.state.plan
        assert plan is not None
        starts: dict[int, int] = {}
        for rank in self.state.captured:
            meta = spool.read_json(
                spool.window_dir(self.spool_dir, rank, plan.id) / spool.HOOK_META
            )
            if isinstance(meta, dict) and isinstance(meta.get("first_step"), int):
                starts[rank] = meta["first_step"]
        if len(set(starts.values())) > 1:
            steps = ", ".join(f"rank {rank}: {step}" for rank, step in sorted(starts.items()))
            self.progress(f"note: the ranks' windows began at different steps ({steps})")

    def process_completed(self) -> None:
        """Turn every completed, not yet processed rank window into worker files."""
        plan = self.state.plan
        assert plan is not None
        for rank in self.state.missing:
            if not window_complete(self.spool_dir, rank, plan.id):
                continue
            self.progress(f"processing rank {rank}…")
            try:
                status = process_window(
                    self.spool_dir,
                    rank,
                    plan.id,
                    self.storage,
                    keep_raw=self.settings.keep_raw,
                    hardware=self._hardware_of(rank),
                )
            except Exception as exc:  # one bad window must not lose the others
                status = self._failed_status(rank, f"processing the window failed: {exc}")
                self.storage.put_text(
                    layout.worker_key(rank, layout.STATUS), status.model_dump_json()
                )
            if status.phase != "done":
                self.progress(f"rank {rank}: no usable window ({status.error or status.phase})")
            self.state.statuses[rank] = status

    def record_missing(self, reason: str) -> None:
        """Write status.json for ranks whose window never completed, so the analysis names
        them (state missing) instead of silently comparing fewer workers."""
        beats = self.beats()
        for rank in self.state.missing:
            beat = beats.get(rank)
            status = self._failed_status(rank, reason, beat)
            self.storage.put_text(layout.worker_key(rank, layout.STATUS), status.model_dump_json())

    def _failed_status(self, rank: int, error: str, beat: RankBeat | None = None) -> WorkerStatus:
        plan = self.state.plan
        return WorkerStatus(
            rank=rank,
            plan_id=plan.id if plan else None,
            phase="failed",
            step=beat.step if beat else 0,
            updated_unix=time.time(),
            error=error,
        )

    def _capture_text(self) -> str:
        beats = {rank: beat for rank, beat in self.beats().items() if rank in self.state.missing}
        done = len(self.state.statuses)
        plan = self.state.plan
        start = plan.start_step if plan is not None and plan.start_step is not None else None
        words = {
            "armed": f"before step {start}" if start is not None else "about to start",
            "dormant": f"before step {start}" if start is not None else "about to start",
            "writing": "writing the trace",
        }
        phases: dict[str, int] = {}
        for beat in beats.values():
            word = words.get(beat.phase, beat.phase)
            if beat.phase == "dormant" and plan is not None and beat.plan_id == plan.id:
                word = "trace written"  # the hook is done with this window: it is ours to read
            phases[word] = phases.get(word, 0) + 1
        doing = ", ".join(f"{count} {phase}" for phase, count in sorted(phases.items()))
        return (
            f"capturing on {len(self.state.ranks)} ranks: {done} done"
            + (f", {doing}" if doing else "")
            + (f" ({steps_text(beats)})" if beats else "")
            + "…"
        )

    def beats(self) -> dict[int, RankBeat]:
        beats = read_beats(self.spool_dir)
        for rank, beat in beats.items():
            self.state.note_beat(rank, beat)
        if beats:
            self.state.max_step_seen = max(
                self.state.max_step_seen, max(beat.step for beat in beats.values())
            )
        return beats

    def window_needs_text(self) -> str:
        start, capture = self.start_step, self.settings.capture_steps
        plan = self.state.plan
        if self.settings.trigger is not None and plan is not None and plan.start_step is not None:
            return f"it covers steps {plan.start_step}–{plan.start_step + capture}"
        return (
            f"the window needs {start + 1 + capture} steps ({start} warm-up, 1 profiler "
            f"warm-up, {capture} captured)"
        )


def fitting_window(steps: int, warmup_steps: int, capture_steps: int) -> tuple[int, int] | None:
    """(--warmup-steps, --capture-steps) of the largest window a job of `steps` steps holds:
    a quarter of it at most for the warm-up (the first steps are slow), the rest captured; None
    when it is too short for any (1 warm-up + 1 profiler warm-up + 1 captured step)."""
    warmup = max(1, min(warmup_steps, steps // 4))
    capture = min(capture_steps, steps - warmup - 1)
    return (warmup, capture) if capture >= 1 else None


def watch_plan(rule: SlowdownRule) -> Plan:
    """The `watch` plan of a run with a slowdown trigger: the hooks report their step times."""
    return Plan(
        id=f"watch-{uuid.uuid4().hex[:12]}",
        action="watch",
        steps=rule.baseline_steps,
        deadline=watch_deadline(datetime.now(timezone.utc)),
    )
