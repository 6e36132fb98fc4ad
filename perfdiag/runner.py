"""A local run (`perfdiag run`, `perfdiag demo`): start the ranks with torchrun and the hook,
capture one window, process it with the in-process agent, analyze, show the verdict, and let
the training finish (DESIGN.md §2 "Local")."""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from perfdiag.api import Verdict
from perfdiag.cli import CliError
from perfdiag.local.failure import training_failed_message
from perfdiag.local.progress import Progress
from perfdiag.local.torchrun import LaunchTarget
from perfdiag.local.training import SignalForwarding, TrainingProcess
from perfdiag.local.window import (
    NO_STEPS_HINT,
    Interrupted,
    TrainingEnded,
    WindowCoordinator,
    WindowSettings,
)
from perfdiag.storage import Storage, StorageError, layout

EXIT_TRAINING_FAILED = 3
EXIT_WINDOW_INCOMPLETE = 4
# How long to wait for the training to exit when no rank could finish the window.
ENDED_GRACE_S = 20.0


@dataclass(frozen=True)
class LocalRun:
    torchrun_argv: list[str]
    target: LaunchTarget
    settings: WindowSettings
    multi_node: bool = False
    json_output: bool = False
    spool_dir: Path | None = None


@dataclass
class RunResult:
    verdict: Verdict | None
    training_exit: int | None


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
    on_verdict: Callable[[Verdict], None],
) -> RunResult:
    """Run the training to its end; `on_verdict` is called as soon as the verdict exists.

    Raises CliError with the documented exit codes when the training fails (3), ends before the
    window completes (4), or is interrupted (130/143)."""
    from perfdiag.collector.hookdir import materialize

    if run.spool_dir is not None and run.spool_dir.exists() and any(run.spool_dir.iterdir()):
        raise CliError(f"--spool {run.spool_dir} is not empty (old heartbeats would mislead)")
    with tempfile.TemporaryDirectory(prefix="perfdiag-") as tmp:
        hook_dir = materialize(Path(tmp) / "hook")
        spool_dir = run.spool_dir or Path(tmp) / "spool"
        spool_dir.mkdir(parents=True, exist_ok=True)
        plan_path = spool_dir / "plan.json"
        env = training_env(dict(os.environ), hook_dir, spool_dir, plan_path)
        progress("starting: torchrun " + " ".join(run.torchrun_argv[3:]))
        training = TrainingProcess(run.torchrun_argv, env, stdout_to_stderr=run.json_output)
        try:
            with SignalForwarding(training) as signals:
                return _supervise(run, storage, progress, on_verdict, training, signals, spool_dir)
        except StorageError as exc:
            raise CliError(f"cannot write the capture to {storage.uri}: {exc}") from exc
        finally:
            training.stop()


def _supervise(
    run: LocalRun,
    storage: Storage,
    progress: Progress,
    on_verdict: Callable[[Verdict], None],
    training: TrainingProcess,
    signals: SignalForwarding,
    spool_dir: Path,
) -> RunResult:
    def check() -> None:
        if signals.received is not None:
            raise Interrupted
        code = training.poll()
        if code is not None:
            raise TrainingEnded(code)

    window = WindowCoordinator(
        run.settings, spool_dir, spool_dir / "plan.json", storage, progress, check
    )
    try:
        window.wait_for_warmup()
        window.request_capture()
        window.collect()
    except Interrupted:
        _stop_on_signal(training, signals, progress)
    except TrainingEnded as ended:
        if window.state.plan is not None:
            window.process_completed()
        if ended.code != 0:
            _partial_verdict(window, storage, progress, on_verdict)
        raise _ended_error(ended.code, window, training) from None

    if not window.state.captured:
        # Every rank's hook gave up on the window: when that is because the processes exited,
        # say so (training too short, or failed) rather than only relaying the hooks' reasons.
        code = training.wait(ENDED_GRACE_S)
        if code is not None:
            raise _ended_error(code, window, training)
        raise CliError(
            f"no rank produced a usable capture window ({window.state.failures_text()})",
            EXIT_WINDOW_INCOMPLETE,
        )

    verdict = _analyze_window(run, window, storage, progress, check)
    if verdict is not None:
        on_verdict(verdict)
    progress("waiting for the training to finish (Ctrl-C stops it)…")
    while True:
        if signals.received is not None:
            _stop_on_signal(training, signals, progress)
        code = training.wait(0.5)
        if code is not None:
            break
    if code != 0:
        raise CliError(
            training_failed_message(code, training.tail.lines(), window.state.max_step_seen)
            + ("\n(the verdict above was written before the training failed)" if verdict else ""),
            EXIT_TRAINING_FAILED,
        )
    return RunResult(verdict=verdict, training_exit=code)


def _ended_error(code: int, window: WindowCoordinator, training: TrainingProcess) -> CliError:
    """The training exited before there was a verdict: failed (3) or too short (4)."""
    steps = window.state.max_step_seen
    if code != 0:
        return CliError(
            training_failed_message(code, training.tail.lines(), steps), EXIT_TRAINING_FAILED
        )
    hint = f" ({NO_STEPS_HINT})" if steps == 0 else ""
    return CliError(
        f"the training ended after {steps} steps{hint}, before the capture window completed: "
        f"{window.window_needs_text()}. Lower --warmup-steps/--capture-steps or train longer.",
        EXIT_WINDOW_INCOMPLETE,
    )


def _analyze_window(
    run: LocalRun,
    window: WindowCoordinator,
    storage: Storage,
    progress: Progress,
    check: Callable[[], None],
) -> Verdict | None:
    """The verdict of the window, or None on a node that leaves the analysis to rank 0's."""
    state = window.state
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


def _analyze(storage: Storage, progress: Progress, expected: list[int]) -> Verdict:
    from perfdiag.analyzer import analyze
    from perfdiag.analyzer.errors import AnalyzerError, NoCaptureError

    progress("analyzing…")
    try:
        return analyze(storage, progress=progress, expected_ranks=expected)
    except NoCaptureError as exc:
        raise CliError(f"no usable capture: {exc}", EXIT_WINDOW_INCOMPLETE) from exc
    except AnalyzerError as exc:
        raise CliError(f"the analysis failed: {exc}") from exc


def _partial_verdict(
    window: WindowCoordinator,
    storage: Storage,
    progress: Progress,
    on_verdict: Callable[[Verdict], None],
) -> None:
    """The training died during the window: analyze the ranks that finished it, naming the
    others as missing (status incomplete)."""
    state = window.state
    if state.plan is None or not state.captured:
        return
    if state.missing:
        window.record_missing("the training ended before this rank finished the window")
    world = state.world_size or len(state.ranks)
    try:
        verdict = _analyze(storage, progress, list(range(world)))
    except CliError as exc:
        progress(f"no partial verdict: {exc}")
        return
    on_verdict(verdict)


def _stop_on_signal(
    training: TrainingProcess, signals: SignalForwarding, progress: Progress
) -> NoReturn:
    """The signal was forwarded to the training; wait for it to stop, then report."""
    progress("stopping the training (press Ctrl-C again to kill it)…")
    while training.wait(0.5) is None:
        pass
    signum = signals.received or signal.SIGINT
    raise CliError("interrupted; the training was stopped", 128 + int(signum))
