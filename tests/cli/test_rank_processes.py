"""torchrun's rank processes found in /proc (a fake tree here; the real one in the e2e runs)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from perfdiag.local.rank_processes import rank_processes


def _process(proc: Path, pid: int, children: list[int], env: dict[str, str]) -> None:
    task = proc / str(pid) / "task" / str(pid)
    task.mkdir(parents=True)
    (task / "children").write_text(" ".join(map(str, children)) + (" " if children else ""))
    (proc / str(pid) / "environ").write_bytes(
        b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items())
    )


def test_the_launchers_children_with_a_rank_are_its_ranks(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    _process(proc, 100, [101, 102, 103], {"PATH": "/bin"})
    _process(proc, 101, [201], {"RANK": "0", "LOCAL_RANK": "0"})
    _process(proc, 102, [], {"RANK": "1", "X": "a=b"})
    _process(proc, 103, [], {"OTHER": "1"})  # a helper process of the launcher
    _process(proc, 201, [], {"RANK": "0"})  # a DataLoader worker of rank 0: not a child
    assert rank_processes(100, str(proc)) == {0: 101, 1: 102}
    assert rank_processes(999, str(proc)) == {}


def test_a_real_child_is_found(tmp_path: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)"], env={**os.environ, "RANK": "3"}
    )
    try:
        found = rank_processes(os.getpid())
        if not Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").exists():
            assert found == {}  # a kernel without the children file: nothing, no error
        else:
            # The kernel's children file is exact only for stopped tasks: on a busy machine a
            # read can miss a running child, which a later read finds.
            deadline = time.monotonic() + 10
            while found.get(3) != child.pid and time.monotonic() < deadline:
                time.sleep(0.05)
                found = rank_processes(os.getpid())
            assert found.get(3) == child.pid
    finally:
        child.kill()
        child.wait()
