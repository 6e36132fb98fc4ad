"""scripts/setup.sh: each checkout's `.venv` runs that checkout's code, while the dependencies
(torch…) live once per machine in a shared environment that never holds perfdiag itself."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WHERE = (
    "import os, perfdiag, perfdiag.analyzer, perfdiag.engine.kineto._scan as s, pytest; "
    "print(*(os.path.realpath(m.__file__) for m in (perfdiag, perfdiag.analyzer, s)))"
)


def _shared_venv(checkout: Path) -> Path | None:
    """The shared environment that the checkout's `.venv` adds (its .pth), if set up so."""
    for pth in (checkout / ".venv").glob("lib/python*/site-packages/perfdiag-shared-deps.pth"):
        found = re.search(r"addsitedir\('(.*)/lib/python[^/]*/site-packages'\)", pth.read_text())
        if found:
            return Path(found.group(1))
    return None


def _imported_from(checkout: Path) -> list[Path]:
    out = subprocess.run(
        [str(checkout / ".venv/bin/python"), "-c", WHERE],
        cwd="/",  # never the checkout itself: its folders must not be found from the cwd
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    return [Path(p) for p in out.split()]


def _inside(path: Path, folder: Path) -> bool:
    return path.is_relative_to(folder.resolve())


def test_this_checkouts_venv_runs_this_checkouts_code() -> None:
    if _shared_venv(ROOT) is None:
        pytest.skip("no .venv made by scripts/setup.sh here")
    assert _inside((ROOT / ".venv").resolve(), ROOT)
    modules = _imported_from(ROOT)
    assert len(modules) == 3
    assert all(_inside(m, ROOT) for m in modules), modules


def test_setup_in_another_checkout_leaves_this_one_alone(tmp_path: Path) -> None:
    shared = _shared_venv(ROOT)
    if shared is None or not (shared / ".perfdiag-complete").exists():
        pytest.skip("no shared environment made by scripts/setup.sh")
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    # The tracked files as they are in the working tree: a clone of what is being tested.
    other = tmp_path / "other"
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, files):
        source = ROOT / os.fsdecode(name)
        if source.is_file():
            (other / os.fsdecode(name)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, other / os.fsdecode(name))
    env = {**os.environ, "PERFDIAG_VENV": str(shared), "PERFDIAG_SKIP_APT": "1"}
    setup = subprocess.run(
        ["scripts/setup.sh"], cwd=other, env=env, capture_output=True, text=True, timeout=600
    )
    assert setup.returncode == 0, setup.stderr

    theirs = _imported_from(other)
    assert all(_inside(m, other) for m in theirs), theirs
    assert theirs[2].name.startswith("_scan."), "the clone builds its own C extension"
    ours = _imported_from(ROOT)
    assert all(_inside(m, ROOT) for m in ours), ours
    # The shared environment has no perfdiag for anyone to re-point.
    assert not list(shared.glob("lib/python*/site-packages/perfdiag-*.dist-info"))
    assert not list(shared.glob("lib/python*/site-packages/__editable__*perfdiag*"))
