"""The hook folder is Python 3.9 code (training images carry old interpreters)."""

from __future__ import annotations

import ast
import glob
import os
import shutil
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from perfdiag.api.plan import Plan
from perfdiag.collector import hookdir
from perfdiag.collector.hook import spool

RUN_WITHOUT_TORCH = textwrap.dedent(
    """
    import os, sys, time
    import perfdiag.collector
    stop = sys.argv[1]
    deadline = time.monotonic() + 120
    while not os.path.exists(stop) and time.monotonic() < deadline:
        perfdiag.collector.step()
        time.sleep(0.05)
    print("done", sys.version_info[:2])
    """
)


def python39() -> str | None:
    candidates = [shutil.which("python3.9") or ""]
    pyenv_root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates += sorted(
        glob.glob(os.path.join(pyenv_root, "versions", "3.9*", "bin", "python3.9"))
    )
    for candidate in filter(None, candidates):
        try:
            done = subprocess.run(
                [candidate, "-c", "import sys; print(sys.version_info[:2] == (3, 9))"],
                capture_output=True,
                text=True,
                timeout=60,
            )
        except OSError:
            continue
        if done.stdout.strip() == "True":
            return candidate
    return None


def test_hook_files_parse_as_python_39(tmp_path: Path) -> None:
    dest = hookdir.materialize(tmp_path / "hook")
    for path in dest.rglob("*.py"):
        ast.parse(path.read_text(), filename=str(path), feature_version=(3, 9))


@pytest.mark.slow
def test_hook_runs_on_python_39_without_torch(hooked: Any) -> None:
    interpreter = python39()
    if interpreter is None:
        pytest.skip("no Python 3.9 interpreter on this machine (python3.9, ~/.pyenv/versions/3.9*)")
    stop = hooked.tmp / "stop"
    proc = subprocess.Popen(
        [interpreter, "-c", RUN_WITHOUT_TORCH, str(stop)],
        env=hooked.env(),
        cwd=hooked.tmp,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        hooked.wait_until(lambda: hooked.heartbeat().get("step", 0) >= 3, "3 steps on 3.9")
        hooked.write_plan(Plan.new(action="stacks", plan_id="s39"))
        dump = hooked.wait_until(
            lambda: spool.read_json(spool.stacks_file(hooked.spool, 0, "s39")), "3.9 stacks"
        )
        hooked.write_plan(Plan.new(plan_id="c39", steps=1))
        meta = hooked.wait_hook_meta("c39")
    finally:
        stop.touch()
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and out.strip() == "done (3, 9)", err
    assert dump["threads"][0]["main"] is True
    assert (
        meta["error"]
        == "could not start the profiler: RuntimeError: torch is not imported by this process"
    )
    assert sum("perfdiag hook" in line for line in err.splitlines()) == 1, err
    assert hooked.heartbeat()["exited"] is True
