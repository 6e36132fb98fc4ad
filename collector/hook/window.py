"""One capture window, driven from the training thread at step boundaries.

The window profiles steps n0 … n0+k (k = plan steps; n0 is the profiler's warm-up). Each
profiled step n is wrapped in a "ProfilerStep#n" user annotation (on the trace clock) and its
start recorded in `step_marks` on the hook clock (time.perf_counter_ns), so that the GC pauses
recorded on the hook clock can be placed on the trace. Files are written when the window ends:
trace.json, then hook.json last (spool contract in collector/hook/spool.py).

Each mark also carries the training thread's CPU counters read at that very boundary (its
on-CPU time, its run-queue wait from /proc schedstat, the process's CPU time): exact per-step
CPU accounting. The agent's sampler reads the same counters from outside, but on a busy host it
waits for a CPU too and its samples fall tens of ms apart, smearing one step into the next.
A few µs per boundary, inside the window only.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from perfdiag.collector.hook import spool
from perfdiag.collector.hook.plan import HookPlan
from perfdiag.collector.hook.profiler import ProfilerSession

MAX_GC_RECORDS = 100_000  # a runaway GC loop must not grow memory without bound


class CaptureWindow:
    def __init__(
        self,
        plan: HookPlan,
        plan_data: Dict[str, Any],
        first_step: int,
        folder: Path,
        identity: Dict[str, Any],
    ) -> None:
        self.plan = plan
        self.first_step = first_step
        self.last_step = first_step + plan.steps  # the last profiled step
        self.folder = folder
        self.error: Optional[str] = None
        self._plan_data = plan_data
        self._identity = identity
        self._has_cuda = False
        self._session: Optional[ProfilerSession] = None
        self._annotation: Optional[Any] = None
        self._marks: List[Dict[str, int]] = []
        self._gc: List[Dict[str, Any]] = []
        self._gc_start: Dict[int, int] = {}
        self._gc_registered = False
        self._start_hold_ns = 0
        self._export = ""
        self._torch_version: Optional[str] = None
        self._schedstat_fd: Optional[int] = None

    # --- training thread -------------------------------------------------------------------

    def start(self) -> None:
        """Begin profiling step `first_step` (called at the boundary where it begins)."""
        begun = time.perf_counter_ns()
        torch = sys.modules.get("torch")
        if torch is None:
            raise RuntimeError("torch is not imported by this process")
        self._torch_version = str(torch.__version__)
        self._has_cuda = "cuda" in self.plan.activities and bool(torch.cuda.is_available())
        self._session = ProfilerSession(cuda=self._has_cuda, python_stacks=self.plan.python_stacks)
        self._session.start()
        self._schedstat_fd = _open_schedstat()
        # The profiler's start allocates: collect now, inside the profiler's warm-up step (not
        # analysed), so that no full collection perfdiag caused lands in the window's steps.
        gc.collect()
        gc.callbacks.append(self._on_gc)
        self._gc_registered = True
        self._enter_step(self.first_step)
        self._start_hold_ns = time.perf_counter_ns() - begun

    def boundary(self, step: int) -> bool:
        """Step `step` begins (step-1 ended). True when the window's last step has ended."""
        self._exit_step()
        if step > self.last_step:
            self._unregister_gc()
            self._marks.append(self._mark(step))
            self._close_schedstat()
            return True
        self._enter_step(step)
        return False

    def finish(self) -> Dict[str, Any]:
        """Stop profiling, write trace.json then hook.json; returns hook.json's content.
        Failures end up in `error` (and in hook.json when it can be written)."""
        begun = time.perf_counter_ns()
        self._unregister_gc()
        self._close_schedstat()
        session, self._session = self._session, None
        if session is not None and self.error is None:
            try:
                spool.make_dirs(self.folder)
                tmp = self.folder / f".{spool.TRACE}.{os.getpid()}.tmp.json"
                self._export = session.stop_and_export(str(tmp))
                spool.readable_by_all(tmp)  # torch wrote it under the training's umask
                os.replace(tmp, self.folder / spool.TRACE)
            except Exception as exc:
                session.abort()
                self.error = f"could not stop the profiler or write the trace: {_describe(exc)}"
        elif session is not None:
            session.abort()
        return self._write_meta(stop_hold_ns=time.perf_counter_ns() - begun)

    def abort(self, error: str) -> Dict[str, Any]:
        """End the window early (failure, process exit): stop recording, keep no trace."""
        if self.error is None:
            self.error = error
        self._annotation = None
        self._unregister_gc()
        self._close_schedstat()
        session, self._session = self._session, None
        if session is not None:
            session.abort()
        return self._write_meta(stop_hold_ns=0)

    # --- internals -------------------------------------------------------------------------

    def _enter_step(self, step: int) -> None:
        from torch.autograd.profiler import record_function

        annotation: Any = record_function(f"ProfilerStep#{step}")
        self._marks.append(self._mark(step))
        annotation.__enter__()
        self._annotation = annotation

    def _exit_step(self) -> None:
        annotation, self._annotation = self._annotation, None
        if annotation is not None:
            annotation.__exit__(None, None, None)

    def _mark(self, step: int) -> Dict[str, int]:
        mark = {
            "step": step,
            "clock_ns": time.perf_counter_ns(),
            "thread_cpu_ns": time.thread_time_ns(),
            "process_cpu_ns": time.process_time_ns(),
        }
        fd = self._schedstat_fd
        if fd is not None:
            try:
                # schedstat: on-CPU ns, run-queue wait ns, timeslices.
                mark["thread_wait_ns"] = int(os.pread(fd, 128, 0).split()[1])
            except (OSError, ValueError, IndexError):
                self._close_schedstat()
        return mark

    def _close_schedstat(self) -> None:
        fd, self._schedstat_fd = self._schedstat_fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _on_gc(self, phase: str, info: Dict[str, Any]) -> None:
        # Runs inside the collector, on whichever thread triggered it: record, nothing more.
        now = time.perf_counter_ns()
        tid = threading.get_native_id()
        if phase == "start":
            self._gc_start[tid] = now
            return
        start = self._gc_start.pop(tid, None)
        if start is not None and len(self._gc) < MAX_GC_RECORDS:
            self._gc.append(
                {
                    "start_ns": start,
                    "end_ns": now,
                    "generation": info.get("generation"),
                    "collected": info.get("collected"),
                    "uncollectable": info.get("uncollectable"),
                    "tid": tid,
                }
            )

    def _unregister_gc(self) -> None:
        if self._gc_registered:
            self._gc_registered = False
            with contextlib.suppress(ValueError):
                gc.callbacks.remove(self._on_gc)

    def _write_meta(self, stop_hold_ns: int) -> Dict[str, Any]:
        meta = dict(self._identity)
        meta.update(
            {
                "torch_version": self._torch_version,
                "plan": self._plan_data,
                "first_step": self.first_step,
                "steps": self.plan.steps,
                "python_stacks": self.plan.python_stacks,
                "has_cuda": self._has_cuda,
                "clock": "perf_counter_ns",
                "step_marks": list(self._marks),
                "gc": list(self._gc),
                "export": self._export or None,
                "hold_ms": {
                    "start": round(self._start_hold_ns / 1e6, 3),
                    "stop": round(stop_hold_ns / 1e6, 3),
                },
                "error": self.error,
            }
        )
        try:
            spool.write_json_atomic(self.folder / spool.HOOK_META, meta)
        except OSError as exc:
            self.error = self.error or f"could not write {spool.HOOK_META}: {_describe(exc)}"
            raise
        return meta


def _open_schedstat() -> Optional[int]:
    """The calling thread's /proc schedstat, kept open for the window (None off Linux)."""
    try:
        return os.open(f"/proc/self/task/{threading.get_native_id()}/schedstat", os.O_RDONLY)
    except (OSError, AttributeError):
        return None


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
