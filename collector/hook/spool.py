"""The spool: how the hook hands a window to the agent (a local folder, shared emptyDir in pods).

Standard library only: the hook imports this module inside training processes.

    <spool>/rank-<R>/heartbeat.json
        Rewritten atomically about once a second by the hook while the process lives:
        {"rank", "local_rank", "world_size", "pid", "host", "step", "last_step_unix",
         "updated_unix", "phase": "dormant|armed|capturing|writing|failed", "plan_id", "error",
         "pod", "exited"}
        "step" counts the step boundaries seen so far (= the index of the step now running,
        0-based). The first heartbeat is written at the first boundary: a process that never
        steps (the launcher, DataLoader workers) writes none. "phase" is "failed" (with
        "error") when the last plan could not be carried out, until the next plan.
        "exited": true in the last heartbeat of a process that exited normally.
    <spool>/rank-<R>/windows/<plan_id>/trace.json
        The Kineto Chrome trace of the window (torch.profiler's export), with one user
        annotation "ProfilerStep#<n>" spanning each profiled step n.
    <spool>/rank-<R>/windows/<plan_id>/hook.json
        Written LAST (its presence means the window is complete or has failed):
        {"rank", "local_rank", "world_size", "host", "pid", "torch_version", "plan": {...},
         "first_step": n0, "steps": k, "python_stacks": bool, "has_cuda": bool,
         "clock": "perf_counter_ns",
         "step_marks": [{"step": n, "clock_ns": t, "thread_cpu_ns", "thread_wait_ns",
                         "process_cpu_ns"}, ...]   boundaries, hook clock
         "gc": [{"start_ns", "end_ns", "generation", "collected"}, ...]  hook clock
         "error": null | "what went wrong",
         "pod", "export", "hold_ms": {"start", "stop"}}
        The first profiled step (n0) is the profiler's warm-up; analysis uses n0+1 … n0+k.
        step_marks: {"step": n, "clock_ns": t} is the moment step n began, where
        ProfilerStep#n starts in the trace; k+2 marks, the last one (n0+k+1) is the end of
        the window. gc records also carry "uncollectable" and "tid" (the native thread id of
        the thread that collected). "export": how the trace was written ("kineto_result_save"
        or "export_chrome_trace"); "hold_ms": how long the training thread was held to start
        and to end the window. A mark's counters are read at its boundary: the training
        thread's CPU time (CLOCK_THREAD_CPUTIME_ID) and run-queue wait (its /proc schedstat;
        absent where that cannot be read), the process's CPU time (CLOCK_PROCESS_CPUTIME_ID),
        ns. When "error" is set, trace.json may be missing and
        step_marks/gc cover only what was recorded.
    <spool>/rank-<R>/stacks/<plan_id>.json
        A stack dump for a `stacks` plan: {"rank", "pid", "host", "time_unix", "step",
        "threads": [{"thread_id", "name", "daemon", "frames": [{"file", "line", "function"}]}],
        "pod", "plan_id"}; each thread also has "native_id" and "main" (the main thread is
        listed first); frames are outermost first, innermost last (traceback order).
        "training": true marks the thread that counts the steps; "flight_recorder": true when
        the Flight Recorder dump below was written for the same plan.
    <spool>/rank-<R>/stacks/<plan_id>.fr.pkl
        torch's Flight Recorder pickle (`_dump_fr_trace` / `_dump_nccl_trace`), written just
        before the stack dump when torch.distributed is initialized and the recorder is on.
    heartbeat.json also carries "blocked_in": {"file", "line", "function", "collective"} once
    the training thread's step is 2 s late: its innermost frame, and the public
    torch.distributed call it is inside (null when none).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

HEARTBEAT = "heartbeat.json"
TRACE = "trace.json"
HOOK_META = "hook.json"


def rank_dir(spool: Path, rank: int) -> Path:
    return spool / f"rank-{rank}"


def window_dir(spool: Path, rank: int, plan_id: str) -> Path:
    return rank_dir(spool, rank) / "windows" / plan_id


def stacks_file(spool: Path, rank: int, plan_id: str) -> Path:
    return rank_dir(spool, rank) / "stacks" / f"{plan_id}.json"


def flight_recorder_file(spool: Path, rank: int, plan_id: str) -> Path:
    return rank_dir(spool, rank) / "stacks" / f"{plan_id}.fr.pkl"


def ranks_in(spool: Path) -> list[int]:
    ranks = []
    if spool.is_dir():
        for entry in spool.iterdir():
            if entry.name.startswith("rank-") and entry.name[5:].isdigit():
                ranks.append(int(entry.name[5:]))
    return sorted(ranks)


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON through a temp file and rename, so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    text = json.dumps(data)  # the C encoder; json.dump would encode in Python
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    """The JSON in `path`, or None when it is missing or not (yet) valid."""
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None
