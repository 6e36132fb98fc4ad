"""What the session fixtures do when things are missing or tests fail, checked by running pytest
in a child process: missing binaries FAIL, only the opt-out variable skips, logs are kept after
a failed session and everything is removed after a green one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from perfdiag_testing.binaries import find_bin_dir

REPO_ROOT = Path(__file__).resolve().parents[2]
TARGET = "tests/cluster/test_minio_server.py::test_env_holds_the_standard_variables"


def _pytest(args: list[str], cwd: Path, **env: str | None) -> subprocess.CompletedProcess[str]:
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("PERFDIAG_")}
    for name, value in env.items():
        if value is not None:
            child_env[name] = value
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", *args],
        cwd=cwd,
        env=child_env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_missing_binaries_fail_with_instructions(tmp_path: Path) -> None:
    result = _pytest([TARGET], REPO_ROOT, PERFDIAG_BIN_DIR=str(tmp_path))
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "1 error" in output and "skipped" not in output, output
    assert "minio not found" in output
    assert "scripts/test-binaries.sh" in output
    assert "PERFDIAG_SKIP_CLUSTER_TESTS=1" in output


def test_only_the_opt_out_variable_skips(tmp_path: Path) -> None:
    result = _pytest(
        [TARGET], REPO_ROOT, PERFDIAG_BIN_DIR=str(tmp_path), PERFDIAG_SKIP_CLUSTER_TESTS="1"
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "1 skipped" in output
    assert "PERFDIAG_SKIP_CLUSTER_TESTS=1" in output


_CHILD_TESTS = """
import os
from pathlib import Path

def test_uses_minio(minio_server):
    Path(os.environ["WORKDIR_NOTE"]).write_text(str(minio_server.workdir.parent))
    assert minio_server.client().bucket_exists(minio_server.bucket)
    assert os.environ.get("CHILD_SHOULD_FAIL") != "1", "failing on purpose"
"""


def _child_session(tmp_path: Path, fail: bool) -> tuple[subprocess.CompletedProcess[str], Path]:
    """A child session with the real root conftest and one test that uses minio_server."""
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(REPO_ROOT / "tests" / "conftest.py", project / "conftest.py")
    (project / "pytest.ini").write_text("[pytest]\nmarkers =\n    cluster: real servers\n")
    (project / "test_child.py").write_text(_CHILD_TESTS)
    note = tmp_path / "workdir.txt"
    result = _pytest(
        ["--import-mode=importlib", "test_child.py"],
        project,
        PERFDIAG_BIN_DIR=str(find_bin_dir(["minio"], repo_root=REPO_ROOT)),
        WORKDIR_NOTE=str(note),
        CHILD_SHOULD_FAIL="1" if fail else "0",
    )
    return result, Path(note.read_text())


@pytest.mark.cluster
def test_failed_session_keeps_the_server_logs(tmp_path: Path) -> None:
    result, workdir = _child_session(tmp_path, fail=True)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "failing on purpose" in output
    logs = workdir / "minio" / "logs"
    assert f"server logs kept in {logs}" in output
    assert "server logs (kept)" in output  # in the failed test's report
    assert (logs / "minio.log").is_file()
    assert not (workdir / "minio" / "minio-data").exists()  # bulky data dropped
    shutil.rmtree(workdir)


@pytest.mark.cluster
def test_green_session_removes_everything(tmp_path: Path) -> None:
    result, workdir = _child_session(tmp_path, fail=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert not workdir.exists()
