"""Python stacks of every thread of this process, for `stacks` plans (hang diagnosis).

Runs on the hook's own thread, so it answers while the training thread is blocked in a call
that releases the GIL (a collective, a sleep, I/O). It reads frames only: no source lines
(no file I/O), no locks the training thread could hold.
"""

from __future__ import annotations

import sys
import threading
from types import FrameType
from typing import Any, Dict, List, Optional

MAX_FRAMES = 512  # innermost frames kept per thread (deep recursion stays bounded)


def thread_stacks() -> List[Dict[str, Any]]:
    """[{"thread_id", "native_id", "name", "daemon", "main", "frames"}], the main thread
    first; frames outermost first, innermost last (traceback order)."""
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
                "frames": frames,
            }
        )
    dumped.sort(key=lambda entry: (not entry["main"], str(entry["name"])))
    return dumped
