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
