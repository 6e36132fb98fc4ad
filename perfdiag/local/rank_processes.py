"""The launcher's rank processes on this host, found in /proc before they report: a job whose
whole window passes before its first heartbeat is read still gets its CPU sampled."""

from __future__ import annotations

from pathlib import Path


def rank_processes(launcher_pid: int, proc: str = "/proc") -> dict[int, int]:
    """rank → pid of the launcher's child processes that carry a RANK variable (torchrun's
    workers); empty when /proc cannot tell."""
    found: dict[int, int] = {}
    for pid in _children(launcher_pid, Path(proc)):
        rank = _environ(pid, Path(proc)).get(b"RANK")
        if rank is not None and rank.isdigit():
            found[int(rank)] = pid
    return found


def _children(pid: int, proc: Path) -> list[int]:
    try:
        text = (proc / str(pid) / "task" / str(pid) / "children").read_text()
    except OSError:
        return []  # no such process, or a kernel without the children file
    return [int(child) for child in text.split() if child.isdigit()]


def _environ(pid: int, proc: Path) -> dict[bytes, bytes]:
    try:
        raw = (proc / str(pid) / "environ").read_bytes()
    except OSError:
        return {}
    pairs = (entry.partition(b"=") for entry in raw.split(b"\0") if entry)
    return {key: value for key, _, value in pairs}
