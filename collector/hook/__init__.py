"""The in-process hook (docs/design.md §1): loaded by sitecustomize in every rank process.

Standard library and torch only (and torch only once the training has imported it). Dormant by
default: at each step boundary it increments a counter, reads a clock and checks one flag. A
daemon thread ("perfdiag-hook") polls the plan (the agent's fresh copy in the spool, else the
plan file `PERFDIAG_PLAN`: `spool.plan_source`) and writes heartbeats to the spool
(`PERFDIAG_SPOOL`, layout in collector/hook/spool.py) about once a second, and answers `stacks`
plans itself, so they are answered while the training thread is blocked. A `capture` plan arms
the hook; the training thread starts torch.profiler at the next step boundary,
profiles steps + 1 steps and writes the window when it ends (the only time training is held).

Step boundaries: a global optimizer step post hook, counting the steps of one optimizer (the
first that steps; the next one that steps once it is garbage-collected), or explicit
`perfdiag.collector.step()` calls; once step() has been called, optimizer steps no longer
count (the first call takes over the boundary an optimizer step just counted). A process
becomes a "rank process" (thread started, heartbeats written) at its first step boundary, so
the launcher and DataLoader workers, which never step, stay silent.

Every failure is contained: logged once ("perfdiag.hook" logger), the window ends, the hook
goes dormant; nothing is raised into the training. Nothing happens at all unless both
environment variables are set.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import socket
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Dict, Optional, Set, Tuple

from perfdiag.collector.hook import spool
from perfdiag.collector.hook.imports import when_imported
from perfdiag.collector.hook.plan import HookPlan, PlanError, parse_plan, plan_json
from perfdiag.collector.hook.stacks import blocked_frame, flight_recorder_dump, thread_stacks
from perfdiag.collector.hook.window import CaptureWindow

ENV_SPOOL = "PERFDIAG_SPOOL"
ENV_PLAN = "PERFDIAG_PLAN"
POLL_INTERVAL_S = 0.5  # plan file checks; heartbeats every HEARTBEAT_INTERVAL_S
HEARTBEAT_INTERVAL_S = 1.0
STALL_REPORT_S = 2.0  # a step older than this: the heartbeat says where the training thread is
MAX_PLAN_BYTES = 1 << 20
# The ends of the last STEP_RING steps are kept (written in place: no allocation that grows) so
# that the heartbeat can say the mean step time over the last N steps, N ≤ STEP_RING - 2.
STEP_RING = 1024
_LAST_SLOT = STEP_RING - 1
_clock_ns = time.perf_counter_ns  # bound once: the dormant path looks up nothing it can avoid
DEFAULT_MEAN_STEPS = 50  # N until a `watch` plan names another
OPTIMIZER_MODULE = "torch.optim.optimizer"

_log = logging.getLogger("perfdiag.hook")
_hook: Optional[Hook] = None
_install_lock = threading.Lock()
_install_tried = False


def install() -> bool:
    """Set the hook up in this process when PERFDIAG_SPOOL and PERFDIAG_PLAN are set; idempotent,
    never raises. True when the hook is active."""
    global _hook, _install_tried
    with _install_lock:
        if _install_tried:
            return _hook is not None
        _install_tried = True
        spool_dir, plan_path = os.environ.get(ENV_SPOOL), os.environ.get(ENV_PLAN)
        if not spool_dir or not plan_path:
            return False
        try:
            hook = Hook(Path(spool_dir), Path(plan_path), identity_from_env())
            _hook = hook
            when_imported(OPTIMIZER_MODULE, hook.attach_optimizer_hook)
            atexit.register(hook.at_exit)
            if hasattr(os, "register_at_fork"):
                os.register_at_fork(after_in_child=hook.after_fork_in_child)
        except Exception as exc:
            _log.warning("perfdiag hook: not installed: %s", _describe(exc))
            _hook = None
            return False
        return True


def step() -> None:
    """An explicit step boundary (`perfdiag.collector.step()`)."""
    hook = _hook
    if hook is None:
        if _install_tried or not install():
            return
        hook = _hook
        if hook is None:
            return
    hook.explicit_step()


def active_hook() -> Optional[Hook]:
    """The hook of this process, when installed (for tests and diagnostics)."""
    return _hook


def identity_from_env() -> Dict[str, Any]:
    """Who this process is: rank, local rank and world size (torchrun's variables), host, pod.
    The host is the machine: PERFDIAG_NODE_NAME where set (the pod's spec.nodeName, injected
    through the downward API: a pod's own hostname is the pod's), else the hostname."""
    return {
        "rank": _env_int("RANK", 0),
        "local_rank": _env_int("LOCAL_RANK", 0),
        "world_size": _env_int("WORLD_SIZE", 1),
        "host": os.environ.get("PERFDIAG_NODE_NAME") or socket.gethostname(),
        "pod": os.environ.get("POD_NAME") or os.environ.get("HOSTNAME") or None,
        "pid": os.getpid(),
    }


class Hook:
    """The hook's state. Training-thread methods: optimizer_step, explicit_step (and what
    they call); everything else runs on the hook's daemon thread."""

    def __init__(
        self,
        spool_dir: Path,
        plan_path: Path,
        identity: Dict[str, Any],
        poll_interval_s: float = POLL_INTERVAL_S,
    ) -> None:
        self.spool_dir = spool_dir
        self.plan_path = plan_path
        self.identity = identity
        self.rank = int(identity["rank"])
        self.rank_dir = spool.rank_dir(spool_dir, self.rank)
        self.poll_interval_s = poll_interval_s
        self.pid = os.getpid()
        # Read on every step boundary (the dormant path).
        self.step_count = 0
        self._step_ends = [0] * STEP_RING
        self._step_slot = 0
        self._busy = True  # something to do at the next boundary (the first one starts the thread)
        self._explicit = False
        self._leader: Optional[Any] = None  # () -> the optimizer whose steps count
        # Shared with the daemon thread.
        self._lock = threading.Lock()
        self._armed: Optional[Tuple[HookPlan, Dict[str, Any]]] = None
        self._window: Optional[CaptureWindow] = None
        self._disabled = False
        self.phase = "dormant"
        self.plan_id: Optional[str] = None
        self.error: Optional[str] = None
        # Daemon thread only.
        self._thread: Optional[threading.Thread] = None
        self._training_ident: Optional[int] = None  # the thread that steps
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._plan_signature: Optional[Tuple[str, int, int, int]] = None
        self._handled: Set[str] = set()
        self._logged: Set[str] = set()
        self._optimizer_handle: Optional[Any] = None
        self._mean_steps = DEFAULT_MEAN_STEPS

    # --- training thread: step boundaries ---------------------------------------------------

    def attach_optimizer_hook(self, optimizer_module: Any) -> None:
        self._optimizer_handle = optimizer_module.register_optimizer_step_post_hook(
            self.optimizer_step
        )

    def optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """torch's global optimizer step post hook."""
        try:
            if self._explicit:
                return
            leader = self._leader
            if leader is None or leader() is not optimizer:
                if leader is not None and leader() is not None:
                    return  # another optimizer of the same iteration
                self._leader = _reference(optimizer)
            self._step_ended()
        except Exception as exc:
            self._contain(exc)

    def explicit_step(self) -> None:
        try:
            if not self._explicit:
                self._explicit = True
                if self._leader is not None:
                    return  # the optimizer step of this iteration was counted already
            self._step_ended()
        except Exception as exc:
            self._contain(exc)

    def _step_ended(self) -> None:
        """A training step ended: count it, note when in the ring of step ends, and do the
        boundary's work when a plan or a window waits for it."""
        self.step_count += 1
        slot = self._step_slot
        self._step_ends[slot] = _clock_ns()
        self._step_slot = slot + 1 if slot < _LAST_SLOT else 0
        if self._busy:
            self._boundary_work()

    def _boundary_work(self) -> None:
        if os.getpid() != self.pid:
            self._busy = False  # a forked child that steps is not this rank
            return
        if self._thread is None and not self._disabled:
            # A plan written before the training started (a local run) is taken now, so that
            # a window at an early step begins there even when steps take a millisecond.
            self._poll_plan_contained()
            self._start_thread()
        window = self._window
        if window is not None and window.boundary(self.step_count):
            self._window = None
            self._finish_window(window)
        if self._window is None and self._armed is not None and self._may_start(self._armed[0]):
            with self._lock:
                armed, self._armed = self._armed, None
            if armed is not None:
                self._start_window(*armed)
        with self._lock:
            self._busy = not self._disabled and (
                self._window is not None or self._armed is not None
            )

    def _may_start(self, plan: HookPlan) -> bool:
        """At the plan's start step (every rank then captures the same steps), or at once when it
        names none; past the deadline too, so that the window fails with that reason."""
        return (
            plan.start_step is None
            or self.step_count >= plan.start_step
            or time.time() > plan.deadline_unix
        )

    def _start_window(self, plan: HookPlan, plan_data: Dict[str, Any]) -> None:
        folder = spool.window_dir(self.spool_dir, self.rank, plan.id)
        window = CaptureWindow(plan, plan_data, self.step_count, folder, self._identity_now())
        if time.time() > plan.deadline_unix:
            self._end_failed(window, "the plan's deadline passed before the window could start")
            return
        try:
            window.start()
        except Exception as exc:
            self._end_failed(window, f"could not start the profiler: {_describe(exc)}")
            return
        self._window = window
        self._set_phase("capturing", plan.id, None)

    def _finish_window(self, window: CaptureWindow) -> None:
        self._set_phase("writing", window.plan.id, None)
        try:
            window.finish()
        except Exception as exc:
            window.error = window.error or _describe(exc)
        if window.error:
            self._log_once(f"window:{window.plan.id}", f"capture {window.plan.id}: {window.error}")
            self._set_phase("failed", window.plan.id, window.error)
        else:
            self._set_phase("dormant", window.plan.id, None)

    def _end_failed(self, window: CaptureWindow, error: str) -> None:
        self._log_once(f"window:{window.plan.id}", f"capture {window.plan.id}: {error}")
        self._set_phase("failed", window.plan.id, error)
        try:
            window.abort(error)
        except Exception as exc:
            self._log_once(f"meta:{window.plan.id}", f"capture {window.plan.id}: {exc}")

    def _contain(self, exc: BaseException) -> None:
        """An unexpected failure on the training thread: end the window, go dormant for good."""
        try:
            self._disabled = True
            self._busy = False
            window, self._window = self._window, None
            message = f"internal error, the hook is now off: {_describe(exc)}"
            if window is not None:
                self._end_failed(window, message)
            else:
                self._log_once("internal", message)
                self._set_phase("failed", self.plan_id, message)
        except Exception:
            pass

    # --- process lifecycle ------------------------------------------------------------------

    def at_exit(self) -> None:
        """Interpreter exit: a window still open is reported as failed; a last heartbeat."""
        if os.getpid() != self.pid or self._thread is None:
            return
        try:
            self._stop.set()
            self._wake.set()
            thread = self._thread
            if thread is not threading.current_thread():
                thread.join(timeout=2.0)
            window, self._window = self._window, None
            if window is not None:
                done = max(0, self.step_count - window.first_step)
                self._end_failed(
                    window,
                    f"the process exited after {done} of the window's "
                    f"{window.plan.steps + 1} steps",
                )
            self._write_heartbeat(exited=True)
        except Exception:
            pass

    def after_fork_in_child(self) -> None:
        # Forked children (DataLoader workers) share this rank's identity: they stay silent.
        self._disabled = True
        self._busy = False
        self._window = None
        self._thread = None

    def close(self) -> None:
        """Stop the daemon thread and detach from torch (tests; normal processes just exit)."""
        self._disabled = True
        self._busy = False
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        if self._optimizer_handle is not None:
            self._optimizer_handle.remove()
            self._optimizer_handle = None

    # --- daemon thread ----------------------------------------------------------------------

    def _start_thread(self) -> None:
        # Called at the first step boundary, on the training thread.
        self._training_ident = threading.get_ident()
        thread = threading.Thread(target=self._run, name="perfdiag-hook", daemon=True)
        self._thread = thread
        thread.start()

    def _run(self) -> None:
        next_beat = 0.0
        while not self._stop.is_set():
            self._poll_plan_contained()
            now = time.monotonic()
            if now >= next_beat or self._wake.is_set():
                self._wake.clear()
                self._write_heartbeat()
                next_beat = now + HEARTBEAT_INTERVAL_S
            self._wake.wait(self.poll_interval_s)

    def _poll_plan_contained(self) -> None:
        try:
            self._poll_plan()
        except Exception as exc:
            self._log_once(f"poll:{_describe(exc)}", f"reading the plan failed: {exc}")

    def _poll_plan(self) -> None:
        # The agent's copy of the pod's plan while the agent keeps it fresh (it reads the plan
        # from storage within seconds), else the plan file (the kubelet's downward-API file,
        # refreshed at the kubelet's own pace): spool.plan_source.
        path = spool.plan_source(self.spool_dir, self.plan_path, time.time()) or self.plan_path
        try:
            stat = os.stat(path)
        except FileNotFoundError:
            self._plan_signature = None
            return
        except OSError as exc:
            self._log_once(f"stat:{exc}", f"cannot read the plan file {path}: {exc}")
            return
        signature = (str(path), stat.st_mtime_ns, stat.st_size, stat.st_ino)
        if signature == self._plan_signature:
            return
        self._plan_signature = signature
        try:
            with open(path, "rb") as fh:
                raw = fh.read(MAX_PLAN_BYTES + 1)
            if len(raw) > MAX_PLAN_BYTES:
                raise PlanError(f"the plan file is larger than {MAX_PLAN_BYTES} bytes")
            text = plan_json(raw)
            if text is None:
                return
            plan = parse_plan(text)
        except PlanError as exc:
            self._log_once(f"plan:{exc}", f"ignoring the plan in {path}: {exc}")
            return
        except OSError as exc:
            self._log_once(f"read:{exc}", f"cannot read the plan file {path}: {exc}")
            self._plan_signature = None  # try again
            return
        self._consider(plan, text)

    def _consider(self, plan: HookPlan, text: str) -> None:
        if plan.id in self._handled or self._already_answered(plan):
            self._handled.add(plan.id)
            return
        self._handled.add(plan.id)
        if time.time() > plan.deadline_unix:
            self._log_once(f"expired:{plan.id}", f"plan {plan.id} is past its deadline; ignored")
            return
        if plan.action == "stacks":
            self._dump_stacks(plan)
            return
        if plan.action == "watch":
            self._mean_steps = min(plan.steps, STEP_RING - 2)
            return
        folder = spool.window_dir(self.spool_dir, self.rank, plan.id)
        try:
            spool.make_dirs(folder)
        except OSError as exc:
            error = f"cannot write to the spool {self.spool_dir}: {exc}"
            self._log_once(f"spool:{exc}", f"capture {plan.id} not started: {error}")
            self._set_phase("failed", plan.id, error)
            return
        plan_data = json.loads(text)
        with self._lock:  # the training thread takes the plan under this lock
            replaced = self._armed
            self._armed = (plan, plan_data)
            self._busy = not self._disabled
            if self._window is None:  # else it starts when the current window ends
                self._set_phase("armed", plan.id, None)
        if replaced is not None:
            self._log_once(
                f"replaced:{replaced[0].id}", f"plan {replaced[0].id} was replaced by {plan.id}"
            )
            self._remove_empty_window(replaced[0].id)

    def _remove_empty_window(self, plan_id: str) -> None:
        """The folder made for a plan that never started: nothing will fill or remove it."""
        with contextlib.suppress(OSError):  # not empty (an earlier process' window), or gone
            os.rmdir(spool.window_dir(self.spool_dir, self.rank, plan_id))

    def _already_answered(self, plan: HookPlan) -> bool:
        """A plan answered before this process started (a restarted container, same spool):
        its files are in the spool, or the agent recorded that it uploaded them."""
        rank, plan_id = self.rank, plan.id
        if plan.action == "stacks":
            return (
                spool.stacks_file(self.spool_dir, rank, plan_id).exists()
                or spool.uploaded_stacks_mark(self.spool_dir, rank, plan_id).exists()
            )
        return (spool.window_dir(self.spool_dir, rank, plan_id) / spool.HOOK_META).exists() or (
            spool.uploaded_window_mark(self.spool_dir, rank, plan_id).exists()
        )

    def _dump_stacks(self, plan: HookPlan) -> None:
        dump = {
            "rank": self.rank,
            "pid": self.pid,
            "host": self.identity.get("host"),
            "pod": self.identity.get("pod"),
            "time_unix": time.time(),
            "step": self.step_count,
            "plan_id": plan.id,
            "threads": thread_stacks(self._training_ident),
        }
        # The Flight Recorder first (in its own file), the stacks last: the stack dump's presence
        # tells the agent that this plan has been answered.
        try:
            recorded = flight_recorder_dump()
        except Exception as exc:
            recorded = None
            self._log_once(f"fr:{_describe(exc)}", f"no Flight Recorder dump: {_describe(exc)}")
        if recorded is not None:
            try:
                spool.write_bytes_atomic(
                    spool.flight_recorder_file(self.spool_dir, self.rank, plan.id), recorded
                )
                dump["flight_recorder"] = True
            except OSError as exc:
                self._log_once(f"fr:{exc}", f"cannot write the Flight Recorder dump: {exc}")
        try:
            spool.write_json_atomic(spool.stacks_file(self.spool_dir, self.rank, plan.id), dump)
        except OSError as exc:
            self._log_once(f"stacks:{exc}", f"cannot write the stacks of plan {plan.id}: {exc}")

    @property
    def last_step_ns(self) -> int:
        """When the last step ended (perf_counter_ns; 0 before the first)."""
        return self._step_ends[self._step_slot - 1] if self.step_count else 0

    def step_times_ms(self, steps: int) -> Optional[Tuple[float, float]]:
        """(mean, longest) duration of the last `steps` steps, in ms (daemon thread: reads the
        ring the training thread writes; a step ending meanwhile overwrites the oldest slot)."""
        if not 1 <= steps <= STEP_RING - 2 or self.step_count <= steps:
            return None
        newest = self._step_slot - 1
        ends = [self._step_ends[(newest - steps + i) % STEP_RING] for i in range(steps + 1)]
        if ends[0] <= 0 or ends[-1] <= ends[0]:
            return None
        longest = max(ends[i + 1] - ends[i] for i in range(steps))  # no pairwise on 3.9
        return (ends[-1] - ends[0]) / steps / 1e6, longest / 1e6

    def _write_heartbeat(self, exited: bool = False) -> None:
        if os.getpid() != self.pid:
            return
        now = time.time()
        last_ns = self.last_step_ns
        last_unix = now - (time.perf_counter_ns() - last_ns) / 1e9 if last_ns else None
        beat = dict(self.identity)
        beat.update(
            {
                "step": self.step_count,
                "last_step_unix": last_unix,
                "updated_unix": now,
                "phase": self.phase,
                "plan_id": self.plan_id,
                "error": self.error,
                "exited": exited,
            }
        )
        times = self.step_times_ms(self._mean_steps)
        if times is not None:
            beat["mean_step_ms"] = round(times[0], 4)
            beat["max_step_ms"] = round(times[1], 4)
            beat["mean_steps"] = self._mean_steps
        if last_unix is not None and now - last_unix >= STALL_REPORT_S and not exited:
            # The step is late: say where the training thread is (costs nothing while the
            # training advances; the frames are read on this thread).
            beat["blocked_in"] = blocked_frame(self._training_ident)
        try:
            spool.write_json_atomic(self.rank_dir / spool.HEARTBEAT, beat)
        except OSError as exc:
            self._log_once(f"heartbeat:{exc}", f"cannot write heartbeats to the spool: {exc}")

    # --- shared helpers ---------------------------------------------------------------------

    def _set_phase(self, phase: str, plan_id: Optional[str], error: Optional[str]) -> None:
        self.phase, self.plan_id, self.error = phase, plan_id, error
        self._wake.set()  # heartbeat now

    def _identity_now(self) -> Dict[str, Any]:
        identity = dict(self.identity)
        identity["pid"] = os.getpid()
        return identity

    def _log_once(self, key: str, message: str) -> None:
        if key in self._logged:
            return
        self._logged.add(key)
        _log.warning("perfdiag hook (rank %d): %s", self.rank, message)


def _reference(obj: Any) -> Any:
    """A weak reference when the object allows one (it may be garbage-collected)."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
