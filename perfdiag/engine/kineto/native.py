"""The C scanner (_scan.c), or, where it was not built, its Python stand-in.

The extension is optional (setup.py): an install without a C compiler succeeds without it.
Then `BUILT` is False, every trace is read by the general reader (perfdiag.engine.kineto.parse), whose
Squeezer and prune come from perfdiag.engine.kineto.scan_python, and the first trace read says so in
one line on stderr — the same tables, several times slower (docs/decisions.md)."""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from perfdiag.engine.kineto._scan import Scanner, Squeezer, prune

    BUILT: bool
else:
    try:
        from perfdiag.engine.kineto._scan import Scanner, Squeezer, prune

        BUILT = True
    except ImportError:
        from perfdiag.engine.kineto.scan_python import Squeezer, prune

        Scanner = None
        BUILT = False

__all__ = ["BUILT", "NOT_BUILT", "Scanner", "Squeezer", "prune", "say_not_built"]

NOT_BUILT = (
    "perfdiag: the C scanner of Kineto traces (perfdiag.engine.kineto._scan) is not built (perfdiag "
    "was installed without a C compiler): traces are read by the general reader, several times "
    "slower; install a C compiler (gcc) and reinstall perfdiag for the fast reader"
)
_LOCK = threading.Lock()
_SAID: list[bool] = []


def say_not_built() -> None:
    """Print NOT_BUILT on stderr, once per process."""
    with _LOCK:
        if _SAID:
            return
        _SAID.append(True)
    print(NOT_BUILT, file=sys.stderr, flush=True)
