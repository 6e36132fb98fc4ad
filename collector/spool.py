"""The spool: how the hook hands a window to the agent (a local folder, shared emptyDir in pods).

Standard library only: the hook imports this module inside training processes.

    <spool>/rank-<R>/heartbeat.json
        Rewritten atomically about once a second by the hook while the process lives:
        {"rank", "local_rank", "world_size", "pid", "host", "step", "last_step_unix",
         "updated_unix", "phase": "dormant|armed|capturing|writing|failed", "plan_id", "error"}
    <spool>/rank-<R>/windows/<plan_id>/trace.json
        The Kineto Chrome trace of the window (torch.profiler's export), with one user
        annotation "ProfilerStep#<n>" spanning each profiled step n.
    <spool>/rank-<R>/windows/<plan_id>/hook.json
        Written LAST (its presence means the window is complete or has failed):
        {"rank", "local_rank", "world_size", "host", "pid", "torch_version", "plan": {...},
         "first_step": n0, "steps": k, "python_stacks": bool, "has_cuda": bool,
         "clock": "perf_counter_ns",
         "step_marks": [{"step": n, "clock_ns": t}, ...]   boundaries, hook clock
         "gc": [{"start_ns", "end_ns", "generation", "collected"}, ...]  hook clock
         "error": null | "what went wrong"}
        The first profiled step (n0) is the profiler's warm-up; analysis uses n0+1 … n0+k.
    <spool>/rank-<R>/stacks/<plan_id>.json
        A stack dump for a `stacks` plan: {"rank", "pid", "host", "time_unix", "step",
        "threads": [{"thread_id", "name", "daemon", "frames": [{"file", "line", "function"}]}]}
"""

from __future__ import annotations

import json
import os
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
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    """The JSON in `path`, or None when it is missing or not (yet) valid."""
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None
