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
    <spool>/agent/rank-<R>/windows/<plan_id>.json
    <spool>/agent/rank-<R>/stacks/<plan_id>.json
        The agent's record that it uploaded that window (with its outcome, the worker status)
        or that stack dump: {"storage", "time_unix", "status"?}. The agent writes these in a
        folder of its own and then removes the window's or the dump's files from the spool; the
        hook takes a plan with such a record as answered, as it does one with hook.json or a
        stack dump.
    <spool>/agent/plan
        The agent's copy of its pod's plan (on Kubernetes: read from storage, where the
        operator writes it beside the pod's plan annotation): the plan in its canonical form,
        an empty file when the pod has none. The agent rewrites it, or touches it, every few
        seconds while it can read the plan; the hook reads it instead of its plan file
        (PERFDIAG_PLAN, the kubelet's downward-API file) while its mtime is at most
        AGENT_PLAN_FRESH_S old (`plan_source`). An agent that stopped or cannot reach storage
        lets it go stale, and the hooks fall back to the kubelet's file.

Permissions: the training and the agent usually run as different users (a training image's
root, the perfdiag image's 10001). Every folder the hook creates is made rwx for everyone
(DIR_MODE, set with chmod after mkdir so that the umask does not apply; no sticky bit), so
that the agent can remove what it has uploaded, and every file it writes is made readable by
everyone (FILE_MODE). Folders that already exist are left as they are. The agent's own folder
is readable by everyone (AGENT_DIR_MODE), for the hook.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path
from typing import Any, List, Optional

HEARTBEAT = "heartbeat.json"
TRACE = "trace.json"
HOOK_META = "hook.json"
AGENT_DIR = "agent"
DIR_MODE = 0o777
FILE_MODE = 0o644
AGENT_DIR_MODE = 0o755
AGENT_PLAN = "plan"
AGENT_PLAN_FRESH_S = 30.0
"""How long the agent's copy of the plan is trusted after the agent last confirmed it (it does
every 5 s by default, at most every 20 s): long enough for a busy agent or a slow storage read, short enough that
the kubelet's file takes over well within a capture's timeout when the agent is gone."""


def rank_dir(spool: Path, rank: int) -> Path:
    return spool / f"rank-{rank}"


def window_dir(spool: Path, rank: int, plan_id: str) -> Path:
    return rank_dir(spool, rank) / "windows" / plan_id


def stacks_file(spool: Path, rank: int, plan_id: str) -> Path:
    return rank_dir(spool, rank) / "stacks" / f"{plan_id}.json"


def flight_recorder_file(spool: Path, rank: int, plan_id: str) -> Path:
    return rank_dir(spool, rank) / "stacks" / f"{plan_id}.fr.pkl"


def uploaded_window_mark(spool: Path, rank: int, plan_id: str) -> Path:
    """The agent's record that it uploaded the window of `plan_id` (see the module doc)."""
    return spool / AGENT_DIR / f"rank-{rank}" / "windows" / f"{plan_id}.json"


def uploaded_stacks_mark(spool: Path, rank: int, plan_id: str) -> Path:
    """The agent's record that it uploaded the stack dump of `plan_id`."""
    return spool / AGENT_DIR / f"rank-{rank}" / "stacks" / f"{plan_id}.json"


def agent_plan_file(spool: Path) -> Path:
    """The agent's copy of its pod's plan (see the module doc)."""
    return spool / AGENT_DIR / AGENT_PLAN


def plan_source(spool: Path, plan_file: Optional[Path], now: float) -> Optional[Path]:
    """The plan file to read at `now` (unix seconds): the agent's copy while it is fresh, else
    `plan_file`. One source at a time: the kubelet's file lags the plan by up to its resync,
    and read beside a fresher copy it could bring back a plan that was already replaced."""
    try:
        mtime = os.stat(agent_plan_file(spool)).st_mtime
    except OSError:
        return plan_file
    return agent_plan_file(spool) if abs(now - mtime) <= AGENT_PLAN_FRESH_S else plan_file


def make_dirs(path: Path, mode: int = DIR_MODE) -> None:
    """Create `path` and its missing parents, each with exactly `mode` whatever the umask
    (where the file system keeps modes); folders that exist already are left as they are.
    Raises OSError like Path.mkdir."""
    missing: List[Path] = []
    folder = path
    while not folder.is_dir() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    for folder in reversed(missing):
        try:
            folder.mkdir()
        except FileExistsError:
            if not folder.is_dir():
                raise
            continue  # made meanwhile by another process (a rank): it sets the mode
        _chmod(folder, mode)


def ranks_in(spool: Path) -> list[int]:
    ranks = []
    if spool.is_dir():
        for entry in spool.iterdir():
            if entry.name.startswith("rank-") and entry.name[5:].isdigit():
                ranks.append(int(entry.name[5:]))
    return sorted(ranks)


def write_json_atomic(path: Path, data: Any, dir_mode: int = DIR_MODE) -> None:
    """Write JSON through a temp file and rename, so a reader never sees half a file."""
    text = json.dumps(data)  # the C encoder; json.dump would encode in Python
    write_bytes_atomic(path, text.encode(), dir_mode)


def write_bytes_atomic(path: Path, data: bytes, dir_mode: int = DIR_MODE) -> None:
    """Write `data` through a temp file and rename; the file gets FILE_MODE, its missing
    folders `dir_mode`."""
    make_dirs(path.parent, dir_mode)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    with open(fd, "wb") as fh:
        _chmod(fd, FILE_MODE)  # the umask applied at creation
        fh.write(data)
    os.replace(tmp, path)


def readable_by_all(path: Path) -> None:
    """Give a file the hook did not write itself (torch's trace export) FILE_MODE."""
    _chmod(path, FILE_MODE)


def _chmod(target: Any, mode: int) -> None:
    """Best effort: a file system without modes (or one that refuses them) still takes the
    files; only another user's agent could then not remove them."""
    with contextlib.suppress(OSError):
        os.chmod(target, mode)


def read_json(path: Path) -> Any:
    """The JSON in `path`, or None when it is missing or not (yet) valid."""
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None
