"""Python stacks of every thread of this process, for `stacks` plans (hang diagnosis).

Runs on the hook's own thread, so it answers while the training thread is blocked in a call
that releases the GIL (a collective, a sleep, I/O). It reads frames only: no source lines
(no file I/O), no locks the training thread could hold.

Also: where the training thread is blocked (for heartbeats once its step is late), and the
collective library's Flight Recorder (torch ≥ 2.3 records the last collectives of every process
group, gloo included in recent releases; `TORCH_FR_BUFFER_SIZE` / `TORCH_NCCL_TRACE_BUFFER_SIZE`
size it, 0 turns it off), read through torch's own `_dump_fr_trace` / `_dump_nccl_trace` pickle.
"""

from __future__ import annotations

import sys
import threading
from types import FrameType
from typing import Any, Dict, List, Optional

MAX_FRAMES = 512  # innermost frames kept per thread (deep recursion stays bounded)


def thread_stacks(training_ident: Optional[int] = None) -> List[Dict[str, Any]]:
    """[{"thread_id", "native_id", "name", "daemon", "main", "training", "frames"}], the main
    thread first; frames outermost first, innermost last (traceback order). "training" marks
    the thread that counts the steps (when known)."""
    threads = {thread.ident: thread for thread in threading.enumerate()}
    main_ident = threading.main_thread().ident
    dumped = []
    for ident, frame in sys._current_frames().items():
        frames: List[Dict[str, Any]] = []
        current: Optional[FrameType] = frame
        while current is not None and len(frames) < MAX_FRAMES:
            code = current.f_code
            frames.append(
                {"file": code.co_filename, "line": current.f_lineno, "function": code.co_name}
            )
            current = current.f_back
        frames.reverse()
        thread = threads.get(ident)
        dumped.append(
            {
                "thread_id": ident,
                "native_id": getattr(thread, "native_id", None),
                "name": thread.name if thread is not None else None,
                "daemon": thread.daemon if thread is not None else None,
                "main": ident == main_ident,
                "training": ident == training_ident,
                "frames": frames,
            }
        )
    dumped.sort(key=lambda entry: (not entry["main"], str(entry["name"])))
    return dumped


DISTRIBUTED_PATH = "torch/distributed/"
WRAPPERS = ("wrapper", "inner", "decorator", "wrapped")  # torch.distributed's decorators


def blocked_frame(training_ident: Optional[int]) -> Optional[Dict[str, Any]]:
    """Where the training thread is now: its innermost frame, and the torch.distributed call
    it is inside when there is one ({"file", "line", "function", "collective"})."""
    if training_ident is None:
        return None
    frame = sys._current_frames().get(training_ident)
    if frame is None:
        return None
    code = frame.f_code
    found: Dict[str, Any] = {
        "file": code.co_filename,
        "line": frame.f_lineno,
        "function": code.co_name,
        "collective": None,
    }
    current: Optional[FrameType] = frame
    depth = 0
    while current is not None and depth < MAX_FRAMES:
        filename = current.f_code.co_filename.replace("\\", "/")
        name = current.f_code.co_name
        if DISTRIBUTED_PATH in filename and not name.startswith("_") and name not in WRAPPERS:
            # The outermost public torch.distributed function is the call the user made
            # (all_reduce, barrier…), not its helpers (wrapper, _check_…).
            found["collective"] = name
        current = current.f_back
        depth += 1
    return found


def flight_recorder_dump() -> Optional[bytes]:
    """torch's Flight Recorder pickle for this process, or None when torch.distributed is not
    initialized here or this torch has no recorder to dump."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    import torch._C._distributed_c10d as c10d

    for name in ("_dump_fr_trace", "_dump_nccl_trace"):
        dump = getattr(c10d, name, None)
        if dump is None:
            continue
        try:
            data = dump()
        except RuntimeError:
            continue  # e.g. a torch built without NCCL for _dump_nccl_trace
        if isinstance(data, bytes) and data:
            return data
    return None
