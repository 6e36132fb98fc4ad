"""Run one command as a container of an image's root filesystem (the test kubelet's image mode,
and the image tests):

    python -I -m perfdiag_testing.rootfs_run --rootfs DIR --scratch DIR [--user UID:GID]
        [--workdir PATH] [--mount INSIDE=HOST[:ro]]... -- COMMAND [ARG]...

In a mount namespace of its own (the mounts vanish with the process): an overlay of --rootfs
(read-only lower layer, the container's writes go to --scratch, so every container starts from
the image as built), /proc, the machine's /dev and /sys, then each --mount bound at its path
inside; chroot into it, change to --workdir, drop to --user (groups cleared) and exec COMMAND
(looked up on the PATH of the environment it was given, inside the image) with this process's
environment. The process keeps its pid, so a signal to it (or its group) reaches COMMAND.
The network is the machine's (loopback addresses included), as in a pod on the host network.

Needs root (mounts, chroot). Standard library only: it runs before anything of the image.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import sys
from pathlib import Path

CLONE_NEWNS = 0x00020000
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    _check(
        _libc.mount(
            source.encode(),
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {source} on {target}",
    )


def bind(source: str, target: str, *, read_only: bool = False, recursive: bool = False) -> None:
    mount(source, target, None, MS_BIND | (MS_REC if recursive else 0), None)
    if read_only:
        mount("none", target, None, MS_BIND | MS_REMOUNT | MS_RDONLY, None)


def _mountpoint(root: Path, inside: str, like: Path) -> str:
    target = root / inside.lstrip("/")
    if like.is_dir():
        target.mkdir(parents=True, exist_ok=True)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch(exist_ok=True)
    return str(target)


def _user(text: str) -> tuple[int, int]:
    uid, _, gid = text.partition(":")
    return int(uid), int(gid or uid)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="rootfs_run")
    parser.add_argument("--rootfs", required=True, type=Path)
    parser.add_argument("--scratch", required=True, type=Path)
    parser.add_argument("--user", default="0:0")
    parser.add_argument("--workdir", default="/")
    parser.add_argument("--mount", action="append", default=[])
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command")

    upper, work, root = (args.scratch / d for d in ("upper", "work", "root"))
    for folder in (upper, work, root):
        folder.mkdir(parents=True, exist_ok=True)
    _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    mount("none", "/", None, MS_REC | MS_PRIVATE, None)
    options = f"lowerdir={args.rootfs},upperdir={upper},workdir={work}"
    mount("overlay", str(root), "overlay", 0, options)
    mount("proc", _mountpoint(root, "/proc", Path("/proc")), "proc", MS_NOSUID | MS_NODEV, None)
    bind("/dev", _mountpoint(root, "/dev", Path("/dev")), recursive=True)
    bind("/sys", _mountpoint(root, "/sys", Path("/sys")), read_only=True, recursive=True)
    for item in args.mount:
        inside, _, host = item.partition("=")
        read_only = host.endswith(":ro")
        host = host.removesuffix(":ro")
        bind(host, _mountpoint(root, inside, Path(host)), read_only=read_only)

    os.chroot(root)
    os.chdir(args.workdir)
    uid, gid = _user(args.user)
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    program = command[0]
    if "/" not in program:
        found = shutil.which(program, path=os.environ.get("PATH", "/usr/bin:/bin"))
        if found is None:
            sys.exit(f"rootfs_run: {program}: not found on PATH in the image")
        program = found
    os.execve(program, command, dict(os.environ))


if __name__ == "__main__":
    main()
