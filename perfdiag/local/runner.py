"""A local run (`perfdiag run`, `perfdiag demo`): start the ranks with torchrun and the hook,
capture one window, process it with the in-process agent, analyze, show the verdict, and let
the training finish (docs/design.md §2 "Local")."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from perfdiag.analyzer import analyze
from perfdiag.analyzer.errors import AnalyzerError, NoCaptureError
from perfdiag.api import Verdict
from perfdiag.api.slowdown import SlowdownWatch
from perfdiag.api.thresholds import Thresholds
from perfdiag.collector.hookdir import materialize
from perfdiag.local.errors import CliError, CliInterrupted
from perfdiag.local.failure import training_failed_message
from perfdiag.local.first_step import NO_STEPS_HINT
from perfdiag.local.hang import EXIT_HANG, HangDetected, HangWatch, collect_stacks
from perfdiag.local.heartbeats import read_beats
from perfdiag.local.native_log import NativeLog
from perfdiag.local.output import Output, native_log_for, wrap_up_output
from perfdiag.local.progress import Progress
from perfdiag.local.torchrun import LaunchTarget
from perfdiag.local.training import SignalForwarding, TrainingProcess
from perfdiag.local.trigger import capture_on_slowdown, capture_storage, wait_for_slowdown
from perfdiag.local.window import (
    Interrupted,
    TrainingEnded,
    WindowCoordinator,
    WindowSettings,
    fitting_window,
)
from perfdiag.storage import Storage, StorageError, layout

EXIT_TRAINING_FAILED = 3
EXIT_WINDOW_INCOMPLETE = 4
# How long to wait for the training to exit when no rank could finish the window.
ENDED_GRACE_S = 20.0
# How long the node with rank 0 waits for the other nodes' stack dumps after a hang.
OTHER_NODES_STACKS_S = 30.0


@dataclass(frozen=True)
class LocalRun:
    torchrun_argv: list[str]
    target: LaunchTarget
    settings: WindowSettings
    multi_node: bool = False
    json_output: bool = False
    spool_dir: Path | None = None
    # Show the profiler's native log lines instead of keeping them out of the terminal.
    verbose: bool = False
    # The local folder perfdiag made for the output: removed when the run captures nothing.
    created_output: Path | None = None


@dataclass
class RunResult:
    verdict: Verdict | None
    training_exit: int | None


@dataclass(frozen=True)
class RunContext:
    """A started run as its supervision sees it: what was asked, where the capture goes, how
    progress and the verdict are shown, and the training and window it watches."""

    run: LocalRun
    storage: Storage
    progress: Progress
    on_verdict: Callable[[Verdict, str], None]
    training: TrainingProcess
    signals: SignalForwarding
    window: WindowCoordinator

    def on(self, window: WindowCoordinator) -> RunContext:
        """The context of another window of the run (a capture on a slowdown: its own
        storage)."""
        return dataclasses.replace(self, window=window, storage=window.storage)


def training_env(
    base: dict[str, str], hook_dir: Path, spool_dir: Path, plan: Path
) -> dict[str, str]:
    """The ranks' environment: the user's, with the hook first on PYTHONPATH (the user's
    PYTHONPATH kept after it) and the hook's two variables."""
    env = dict(base)
    user_path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = os.pathsep.join([str(hook_dir), *([user_path] if user_path else [])])
    env["PERFDIAG_SPOOL"] = str(spool_dir)
    env["PERFDIAG_PLAN"] = str(plan)
    # Output goes through a pipe to perfdiag; unbuffered, it still appears as it is printed.
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def run_local(
    run: LocalRun,
    storage: Storage,
    progress: Progress,
    on_verdict: Callable[[Verdict, str], None],
) -> RunResult:
    """Run the training to its end; `on_verdict` is called as soon as the verdict exists.

    Raises CliError with the documented exit codes when the training fails (3), ends before the
    window completes (4), or is interrupted (130/143)."""
    native_log = None if run.verbose else native_log_for(storage)
    # With several nodes the output is shared: another node may still write into it.
    output = Output(storage, None if run.multi_node else run.created_output)
    failed = True
    try:
        result = _launch(run, storage, progress, on_verdict, native_log)
        # No verdict (a slowdown that never came): the folder goes too when it holds nothing.
        failed = result.verdict is None
        return result
    finally:
        wrap_up_output(output, native_log, progress, failed=failed)


def _launch(
    run: LocalRun,
    storage: Storage,
    progress: Progress,
    on_verdict: Callable[[Verdict, str], None],
    native_log: NativeLog | None,
) -> RunResult:
    if run.spool_dir is not None and run.spool_dir.exists() and any(run.spool_dir.iterdir()):
        raise CliError(f"--spool {run.spool_dir} is not empty (old heartbeats would mislead)")
    with tempfile.TemporaryDirectory(prefix="perfdiag-") as tmp:
        hook_dir = materialize(Path(tmp) / "hook")
        spool_dir = run.spool_dir or Path(tmp) / "spool"
        _check_spool(spool_dir)
        plan_path = spool_dir / "plan.json"
        env = training_env(dict(os.environ), hook_dir, spool_dir, plan_path)
        window = WindowCoordinator(run.settings, spool_dir, plan_path, storage, progress)
        try:
            window.plan_at_start()
        except StorageError as exc:
            raise CliError(f"cannot write the capture to {storage.uri}: {exc}") from exc
        progress("starting: torchrun " + " ".join(run.torchrun_argv[3:]))
        training = TrainingProcess(
            run.torchrun_argv, env, stdout_to_stderr=run.json_output, native_log=native_log
        )
        window.launcher_pid = training.pid
        try:
            with SignalForwarding(training) as signals:
                ctx = RunContext(run, storage, progress, on_verdict, training, signals, window)
                try:
                    return _supervise(ctx)
                except StorageError as exc:
                    # A failed capture is reported; the training it was meant to observe
                    # runs to its end untouched.
                    window.stop_sampler()
                    progress(
                        f"the capture cannot be written to {storage.uri} ({exc}); no verdict. "
                        "The training goes on to its end (Ctrl-C stops it)…"
                    )
                    code = _wait_out(ctx)
                    raise CliError(
                        f"cannot write the capture to {storage.uri}: {exc} (the training ran "
                        f"to its end, exit code {code})"
                    ) from exc
        finally:
            training.stop()


def _supervise(ctx: RunContext) -> RunResult:
    run, window, training, signals = ctx.run, ctx.window, ctx.training, ctx.signals
    stall = run.settings.stall
    watch = HangWatch(window.spool_dir, stall) if stall is not None else None

    def check() -> None:
        if signals.received is not None:
            raise Interrupted
        code = training.poll()
        if code is not None:
            raise TrainingEnded(code)
        if watch is not None:
            watch.check()

    window.check = check
    if run.settings.trigger is not None:
        return _capture_on_slowdowns(ctx)
    try:
        window.wait_for_ranks()
        window.collect()
    except Interrupted:
        _stop_on_signal(ctx)
    except HangDetected as hang:
        _diagnose_hang(ctx, hang)
    except TrainingEnded as ended:
        window.after_training_exit()
        if ended.code != 0:
            _partial_verdict(ctx)
            raise _ended_error(ended.code, window, training) from None
        if window.state.missing or not window.state.captured:
            raise _ended_error(ended.code, window, training) from None
        # A short job can end right after its window: every rank's window is in.

    if not window.state.captured:
        # Every rank's hook gave up on the window: when that is because the processes exited
        # before the window's last step, say so (training too short, or failed) rather than
        # only relaying the hooks' reasons.
        code = training.wait(ENDED_GRACE_S)
        window.beats()
        if code is not None and (code != 0 or window.state.max_step_seen < window.last_step):
            raise _ended_error(code, window, training)
        raise CliError(
            f"no rank produced a usable capture window ({window.state.failures_text()})",
            EXIT_WINDOW_INCOMPLETE,
        )

    try:
        verdict = _analyze_window(ctx, check)
    except HangDetected as hang:
        _diagnose_hang(ctx, hang)
    if verdict is not None:
        ctx.on_verdict(verdict, ctx.storage.uri)
    _wait_for_training_end(ctx, watch, had_verdict=verdict is not None)
    return RunResult(verdict=verdict, training_exit=0)


def _wait_for_training_end(ctx: RunContext, watch: HangWatch | None, *, had_verdict: bool) -> None:
    """After the last window: let the training finish, still diagnosing a hang."""
    training = ctx.training
    ctx.progress("waiting for the training to finish (Ctrl-C stops it)…")
    while True:
        if ctx.signals.received is not None:
            _stop_on_signal(ctx)
        code = training.wait(0.5)
        if code is not None:
            break
        try:
            if watch is not None:
                watch.check()
        except HangDetected as hang:
            # A hang after the window: diagnosed on its own (the verdict above stays valid for
            # the window; the new verdict.json replaces it with the hang).
            _diagnose_hang(ctx, hang)
    if code != 0:
        raise CliError(
            training_failed_message(code, training.tail.lines(), ctx.window.state.max_step_seen)
            + (
                "\n(the verdict above was written before the training failed)"
                if had_verdict
                else ""
            ),
            EXIT_TRAINING_FAILED,
        )


def _capture_on_slowdowns(ctx: RunContext) -> RunResult:
    """--on-slowdown: watch the ranks' step times; on each slowdown capture a window into
    <out>/capture-<n>/ and print its verdict, up to --max-captures times."""
    window, progress, on_verdict = ctx.window, ctx.progress, ctx.on_verdict
    settings = ctx.run.settings
    assert settings.trigger is not None
    slowdowns = SlowdownWatch(settings.trigger)
    stall = settings.stall
    hangs = HangWatch(window.spool_dir, stall) if stall is not None else None
    current, verdict, captures = window, None, 0
    in_flight: WindowCoordinator | None = None  # a capture not analyzed yet
    try:
        window.wait_for_ranks()
        while captures < settings.max_captures:
            fired = wait_for_slowdown(current, slowdowns, progress)
            captures += 1
            current = in_flight = WindowCoordinator(
                settings,
                window.spool_dir,
                window.plan_path,
                capture_storage(ctx.storage, captures),
                progress,
                window.check,
            )
            # The step rate the watch has seen places the window without waiting for more.
            current.state.last_beats = dict(window.state.last_beats)
            plan = capture_on_slowdown(current, fired, progress)
            current.collect()
            in_flight = None
            if current.state.captured:
                verdict = _analyze_window(ctx.on(current), window.check)
                if verdict is not None:
                    on_verdict(verdict, current.storage.uri)
            assert plan.start_step is not None
            # The window's own steps are slower: the next baseline starts after them.
            slowdowns.restart(plan.start_step + settings.capture_steps + 1)
    except Interrupted:
        _stop_on_signal(ctx)
    except HangDetected as hang:
        _diagnose_hang(ctx.on(current), hang)
    except TrainingEnded as ended:
        if in_flight is not None:
            in_flight.after_training_exit()
            if ended.code == 0 and in_flight.state.captured:
                verdict = _analyze_window(ctx.on(in_flight), lambda: None)
                if verdict is not None:
                    on_verdict(verdict, in_flight.storage.uri)
            elif ended.code == 0:
                progress(
                    f"the training ended at step {in_flight.state.max_step_seen}, before the "
                    f"window planned on the last slowdown completed: "
                    f"{in_flight.window_needs_text()}"
                )
        if ended.code != 0:
            raise CliError(
                training_failed_message(
                    ended.code, ctx.training.tail.lines(), window.state.max_step_seen
                ),
                EXIT_TRAINING_FAILED,
            ) from None
        if captures == 0:
            steps = max(window.state.max_step_seen, current.state.max_step_seen)
            progress(
                f"the training ended after {steps} steps without a {settings.trigger.percent:g}% "
                f"slowdown over {settings.trigger.baseline_steps}-step means: nothing captured"
            )
        return RunResult(verdict=verdict, training_exit=0)
    # The last window's hang is diagnosed into the run's own output.
    _wait_for_training_end(
        dataclasses.replace(ctx, window=current), hangs, had_verdict=verdict is not None
    )
    return RunResult(verdict=verdict, training_exit=0)


def _ended_error(code: int, window: WindowCoordinator, training: TrainingProcess) -> CliError:
    """The training exited before there was a verdict: failed (3) or too short (4)."""
    window.beats()  # the ranks' last heartbeats: the steps the training reached
    steps = window.state.max_step_seen
    if code != 0:
        return CliError(
            training_failed_message(code, training.tail.lines(), steps), EXIT_TRAINING_FAILED
        )
    if steps == 0:
        advice = NO_STEPS_HINT
    else:
        fit = fitting_window(steps, window.settings.warmup_steps, window.settings.capture_steps)
        advice = (
            f"run it with --warmup-steps {fit[0]} --capture-steps {fit[1]}, or train longer"
            if fit is not None
            else "train at least 3 steps to be diagnosed"
        )
    return CliError(
        f"the training ended after {steps} steps, before the capture window completed: "
        f"{window.window_needs_text()}; {advice}",
        EXIT_WINDOW_INCOMPLETE,
    )


def _analyze_window(ctx: RunContext, check: Callable[[], None]) -> Verdict | None:
    """The verdict of the window, or None on a node that leaves the analysis to rank 0's."""
    run, storage, progress = ctx.run, ctx.storage, ctx.progress
    state = ctx.window.state
    world = state.world_size or len(state.ranks)
    expected = list(range(world))
    if run.multi_node:
        if 0 not in state.ranks:
            progress(
                f"ranks {', '.join(map(str, state.captured))} captured into {storage.uri}; "
                "the node running rank 0 writes the verdict (or run `perfdiag analyze` on it)"
            )
            return None
        _wait_for_other_nodes(storage, expected, run.settings.timeout_s, progress, check)
    return _analyze(storage, progress, expected)


def _wait_for_other_nodes(
    storage: Storage,
    expected: list[int],
    timeout_s: float,
    progress: Progress,
    check: Callable[[], None],
) -> None:
    """On the node with rank 0: wait until every rank's status.json is in the shared output."""
    deadline = time.monotonic() + timeout_s
    while True:
        missing = [r for r in expected if not storage.exists(layout.worker_key(r, layout.STATUS))]
        if not missing:
            return
        if time.monotonic() > deadline:
            progress(f"ranks {', '.join(map(str, missing))} did not report; analyzing without them")
            return
        progress.status(f"waiting for the other nodes: {len(missing)} ranks not in yet…")
        # This node's training may have ended while other nodes still write: the deadline
        # bounds the wait.
        with contextlib.suppress(TrainingEnded):
            check()
        time.sleep(1.0)


def _analyze(
    storage: Storage,
    progress: Progress,
    expected: list[int],
    thresholds: Thresholds | None = None,
) -> Verdict:
    progress("analyzing…")
    try:
        return analyze(storage, progress=progress, expected_ranks=expected, thresholds=thresholds)
    except NoCaptureError as exc:
        raise CliError(f"no usable capture: {exc}", EXIT_WINDOW_INCOMPLETE) from exc
    except AnalyzerError as exc:
        raise CliError(f"the analysis failed: {exc}") from exc


def _partial_verdict(ctx: RunContext) -> None:
    """The training died during the window: analyze the ranks that finished it, naming the
    others as missing (status incomplete)."""
    state = ctx.window.state
    if state.plan is None or not state.captured:
        return
    if state.missing:
        ctx.window.record_missing("the training ended before this rank finished the window")
    world = state.world_size or len(state.ranks)
    try:
        verdict = _analyze(ctx.storage, ctx.progress, list(range(world)))
    except CliError as exc:
        ctx.progress(f"no partial verdict: {exc}")
        return
    ctx.on_verdict(verdict, ctx.storage.uri)


def _diagnose_hang(ctx: RunContext, hang: HangDetected) -> NoReturn:
    """A rank stopped advancing: dump every rank's stacks, analyze, print the `hang` verdict,
    stop the training and exit EXIT_HANG (instead of waiting for it forever)."""
    run, window, storage, progress, training = (
        ctx.run,
        ctx.window,
        ctx.storage,
        ctx.progress,
        ctx.training,
    )
    stuck = sorted(hang.stuck.values(), key=lambda s: s.rank)
    progress(
        "the training is stuck: "
        + ", ".join(
            f"rank {s.rank} has not left step {s.step} for {s.stalled_s:.0f} s" for s in stuck
        )
        + f" (limit {hang.limit_s:.0f} s); asking every rank for its Python stacks…"
    )
    collect_stacks(
        window.spool_dir,
        window.plan_path,
        storage,
        progress,
        window.state.statuses,
        write_plan_to_storage=window.state.plan is None and run.settings.write_plan_to_storage,
        training_alive=lambda: training.poll() is None,
    )
    beats = read_beats(window.spool_dir)
    worlds = [beat.world_size for beat in beats.values() if beat.world_size]
    world = window.state.world_size or (max(worlds) if worlds else len(beats))
    if run.multi_node:
        if 0 not in beats:
            # One verdict per job: the node running rank 0 writes it (every node notices the
            # hang on its own ranks and writes their stacks into the shared output).
            progress(
                f"stacks of ranks {', '.join(map(str, sorted(beats)))} written to "
                f"{storage.uri}; the node running rank 0 writes the hang verdict"
            )
            progress("stopping the training…")
            training.stop()
            raise CliError("the training hung; perfdiag stopped it on this node", EXIT_HANG)
        _wait_for_stacks(storage, list(range(world)), progress)
    # Ranks stop one after the other (the culprit first, the others at their next collective):
    # the analysis counts as stuck every rank stalled for half the limit that triggered this.
    stall = run.settings.stall
    assert stall is not None
    thresholds = Thresholds(
        stuck_after_seconds=hang.limit_s / 2, stuck_after_steps=stall.step_factor / 2
    )
    try:
        verdict = _analyze(storage, progress, list(range(world)), thresholds)
    finally:
        progress("stopping the training…")
        training.stop()
    ctx.on_verdict(verdict, storage.uri)
    raise CliError(
        "the training hung (verdict above); perfdiag stopped it. Rerun with a larger "
        "--hang-after if the steps are legitimately that slow.",
        EXIT_HANG,
    )


def _wait_for_stacks(storage: Storage, expected: list[int], progress: Progress) -> None:
    """On the node with rank 0: give the other nodes (which notice the hang within about the
    same time) a moment to write their ranks' stack dumps."""
    deadline = time.monotonic() + OTHER_NODES_STACKS_S
    while time.monotonic() < deadline:
        missing = [r for r in expected if not storage.exists(layout.worker_key(r, layout.STACKS))]
        if not missing:
            return
        progress.status(f"waiting for the other nodes' stack dumps: {len(missing)} ranks…")
        time.sleep(1.0)


def _check_spool(spool_dir: Path) -> None:
    """The hooks write heartbeats and traces there: an unwritable spool is said before launch
    (the hooks would only log it, and perfdiag would wait for steps it cannot see)."""
    try:
        spool_dir.mkdir(parents=True, exist_ok=True)
        probe = spool_dir / f".perfdiag-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise CliError(f"the spool {spool_dir} is not writable: {exc}") from exc


def _wait_out(ctx: RunContext) -> int:
    """Wait for the training to end on its own (or for the user's Ctrl-C)."""
    while True:
        if ctx.signals.received is not None:
            _stop_on_signal(ctx)
        code = ctx.training.wait(0.5)
        if code is not None:
            return code


def _stop_on_signal(ctx: RunContext) -> NoReturn:
    """The signal was forwarded to the training; wait for it to stop, then report."""
    ctx.progress("stopping the training (press Ctrl-C again to kill it)…")
    while ctx.training.wait(0.5) is None:
        pass
    signum = ctx.signals.received or signal.SIGINT
    raise CliInterrupted("interrupted; the training was stopped", 128 + int(signum))
