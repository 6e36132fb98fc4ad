"""Opening input files that must be regular files.

A FIFO named like a trace blocks a reader forever, and a link to /dev/zero or /dev/urandom
never ends: both are refused with the reason, without reading a byte (docs/limits.md).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO


class NotRegularFile(OSError):
    """The path is a FIFO, a device, a socket or a folder: its message says which (the
    caller names the path)."""


def _kind(mode: int) -> str | None:
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "not a regular file"


def _refuse(path: Path, kind: str) -> NotRegularFile:
    via = " (through a symbolic link)" if path.is_symlink() else ""
    return NotRegularFile(f"{kind}{via}, not a regular file")


def open_regular(path: Path) -> BinaryIO:
    """`path` opened for reading in binary; NotRegularFile unless it is a regular file (links
    are followed, to what they name). Other OSErrors as open() raises them."""
    mode = os.stat(path).st_mode  # does not open: a FIFO does not block here
    kind = _kind(mode)
    if kind is not None:
        raise _refuse(path, kind)
    # Opened without blocking, then checked again on the descriptor: the path may have been
    # replaced by a FIFO between the two.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        kind = _kind(mode)
        if kind is not None:
            raise _refuse(path, kind)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: Path) -> bytes:
    """The bytes of a regular file (see open_regular)."""
    with open_regular(path) as fh:
        return fh.read()
