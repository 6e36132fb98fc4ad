"""What `perfdiag run` says when the training does not cooperate: it crashes, it is too short
for the window, it never counts a step, or the user presses Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from perfdiag.local.demo.scenarios import TRAIN_SCRIPT


@pytest.mark.slow
def test_training_crash_shows_exit_code_and_last_lines(
    tmp_path: Path, perfdiag: Any, scripts: Path
) -> None:
    out = tmp_path / "diag"
    script = scripts / "crash_train.py"
    result = perfdiag(
        "run", "--nproc-per-node", "2", "--out", str(out), "--", str(script), cwd=tmp_path
    )
    assert result.code == 3, result.explain()
    assert "perfdiag: error: the training failed (torchrun exit code 1)" in result.stderr
    assert "rank 1 exited with code 1" in result.stderr
    message = result.stderr.split("perfdiag: error:", 1)[1]
    # The failed rank's own last lines (its traceback) are quoted, however much the other
    # ranks and torchrun printed after them.
    assert "Last lines of rank 1:" in message
    assert "| [rank1]: RuntimeError: injected failure at step 3" in message
    # Failed before the window: no empty output folder is left behind.
    assert not out.exists()
    assert f"nothing was captured: removed {out}, which perfdiag had created" in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("options", "train_steps"),
    [
        # Over before the warm-up steps are done: the window never begins.
        (("--warmup-steps", "15"), 10),
        # Over in the middle of the window: the hooks report the window as failed.
        (("--warmup-steps", "2", "--capture-steps", "200"), 40),
    ],
)
def test_training_shorter_than_the_window(
    tmp_path: Path, perfdiag: Any, options: tuple[str, ...], train_steps: int
) -> None:
    out = tmp_path / "diag"
    result = perfdiag(
        "run", "--nproc-per-node", "2", "--out", str(out), *options,
        "--", str(TRAIN_SCRIPT), "--steps", str(train_steps), "--min-seconds", "0",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.code == 4, result.explain()
    assert f"the training ended after {train_steps} steps, before the capture window" in (
        result.stderr
    ), result.explain()
    # The advice fits the steps the job has, and it works (tests/e2e/test_short_jobs.py).
    advice = {10: "--warmup-steps 2 --capture-steps 7", 40: "--warmup-steps 2 --capture-steps 37"}
    assert f"run it with {advice[train_steps]}, or train longer" in result.stderr
    assert not (out / "verdict.json").exists()


@pytest.mark.slow
def test_loop_without_optimizer_gets_a_hint(tmp_path: Path, perfdiag: Any) -> None:
    script = tmp_path / "no_steps.py"
    script.write_text("import torch\nprint('no optimizer here', flush=True)\n")
    result = perfdiag("run", "--out", str(tmp_path / "diag"), "--", str(script), cwd=tmp_path)
    assert result.code == 4, result.explain()
    assert "the training ended after 0 steps" in result.stderr
    assert "perfdiag.collector.step()" in result.stderr
    assert "no optimizer here" in result.stdout  # the training's output passes through


def _descendants(pid: int) -> list[int]:
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                children.append(int(entry.name))
    return children + [d for child in children for d in _descendants(child)]


@pytest.mark.slow
def test_ctrl_c_stops_the_training(tmp_path: Path, scripts: Path) -> None:
    perfdiag = subprocess.Popen(
        [sys.executable, "-m", "perfdiag.cli", "run", "--nproc-per-node", "2",
         "--out", str(tmp_path / "diag"), "--", str(TRAIN_SCRIPT), "--min-seconds", "600"],
        cwd=tmp_path, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert perfdiag.stderr is not None
    seen = []
    for line in perfdiag.stderr:
        seen.append(line)
        if any(needle in line for needle in ("ranks running",)):
            break  # both ranks are running
    workers = _descendants(perfdiag.pid)
    assert len(workers) >= 3, seen  # torchrun and its two ranks
    os.kill(perfdiag.pid, signal.SIGINT)
    rest = perfdiag.stderr.read()
    assert perfdiag.wait(timeout=60) == 130, "".join(seen) + rest
    # A deliberate stop is no error; nothing was captured, so the folder perfdiag made is gone.
    assert "perfdiag: interrupted; the training was stopped" in rest
    assert "perfdiag: error" not in rest
    out = tmp_path / "diag"
    assert not out.exists() or (out / "workers").exists(), rest
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()]


@pytest.mark.slow
def test_an_output_that_breaks_mid_capture_never_stops_the_training(tmp_path: Path) -> None:
    out = tmp_path / "diag"
    perfdiag = subprocess.Popen(
        [sys.executable, "-m", "perfdiag.cli", "run", "--nproc-per-node", "2",
         "--warmup-steps", "20", "--capture-steps", "5", "--out", str(out), "--",
         str(TRAIN_SCRIPT), "--steps", "150", "--min-seconds", "0"],
        cwd=tmp_path, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert perfdiag.stderr is not None and perfdiag.stdout is not None
    seen = []
    for line in perfdiag.stderr:
        seen.append(line)
        if "ranks running" in line:
            break
    # The output goes away while the window runs: the folder becomes a file.
    out.rename(tmp_path / "moved")
    out.write_text("not a folder any more")
    rest = perfdiag.stderr.read()
    stdout = perfdiag.stdout.read()
    assert perfdiag.wait(timeout=240) == 1, "".join(seen) + rest
    assert "the capture cannot be written to" in rest
    assert "the training ran to its end, exit code 0" in rest
    assert "demo: finished 150 steps" in stdout, stdout + rest
