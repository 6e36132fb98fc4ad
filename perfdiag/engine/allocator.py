"""Arrow's memory pool while a worker's trace is read and summarized."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pyarrow as pa

_LOCK = threading.Lock()
_USERS: list[Any] = []  # [the pool to restore, then one entry per reader running]


@contextmanager
def system_allocator() -> Iterator[None]:
    """Arrow's default memory pool is the C library's allocator while any trace is read or
    summarized. Their many short-lived buffers go back to it; pyarrow's default (mimalloc)
    kept ~45 MB more resident per file (docs/engine.md). Process-wide, hence counted across
    threads."""
    with _LOCK:
        if not _USERS:
            _USERS.append(pa.default_memory_pool())
        _USERS.append(None)
        pa.set_memory_pool(pa.system_memory_pool())
    try:
        yield
    finally:
        with _LOCK:
            _USERS.pop()
            if len(_USERS) == 1:
                pa.set_memory_pool(_USERS.pop())


def release_memory() -> None:
    """Give the memory freed since the last call back to the system: Arrow's pool keeps freed
    blocks for reuse, and the C library keeps freed heap pages mapped (glibc's malloc_trim
    returns them). Between two traces of `perfdiag analyze`, this brings the process back from
    ~150 MB to ~90 MB, so that the next trace's peak is not added to the last one's leftovers."""
    pa.default_memory_pool().release_unused()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _malloc_trim() -> Any:
    """glibc's malloc_trim, or None (another C library, or no ctypes)."""
    global _TRIM
    if _TRIM is None:
        try:
            import ctypes
            import ctypes.util

            _TRIM = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
        except (ImportError, OSError, AttributeError):
            _TRIM = False
    return _TRIM or None


_TRIM: Any = None  # None: not looked up yet; False: not available
