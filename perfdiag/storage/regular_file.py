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


def _refuse(path: Path | str, kind: str, dir_fd: int | None = None) -> NotRegularFile:
    try:
        link = stat.S_ISLNK(os.lstat(path, dir_fd=dir_fd).st_mode)
    except OSError:
        link = False
    via = " (through a symbolic link)" if link else ""
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


def read_regular(path: Path | str, *, dir_fd: int | None = None) -> bytes:
    """The bytes of a regular file (see open_regular); `dir_fd`: the open folder a relative
    `path` is in. Plain system calls, no file object: a capture of a million workers reads two
    million files of a few KB."""
    # Not opened before it is known to be a file: a device is not even opened.
    kind = _kind(os.stat(path, dir_fd=dir_fd).st_mode)
    if kind is not None:
        raise _refuse(path, kind, dir_fd)
    return _read_open(path, dir_fd, 0)


def read_listed_file(name: str, dir_fd: int) -> bytes:
    """The bytes of `name` in the open folder, which its listing (d_type) showed a regular
    file and no link: opened without following links, checked on the descriptor (it may have
    been replaced meanwhile), with no stat of the path before."""
    return _read_open(name, dir_fd, os.O_NOFOLLOW)


def _read_open(path: Path | str, dir_fd: int | None, flags: int) -> bytes:
    flags |= os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, dir_fd=dir_fd)
    try:
        status = os.fstat(fd)
        kind = _kind(status.st_mode)
        if kind is not None:
            raise _refuse(path, kind, dir_fd)
        wanted = status.st_size + 1
        chunks = [os.read(fd, wanted)]
        # A regular file reads short only at its end; else it grew since the fstat: read on.
        while len(chunks[-1]) == wanted or (len(chunks) > 1 and chunks[-1]):
            wanted = 1 << 20
            chunks.append(os.read(fd, wanted))
        return b"".join(chunks)
    finally:
        os.close(fd)
