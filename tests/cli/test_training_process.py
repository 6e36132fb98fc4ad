"""The training child process: output passes through, Ctrl-C is forwarded once, and the
training does not outlive perfdiag."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

# The child restores Python's SIGINT handler: a test run in the background (nohup, `cmd &`)
# starts with SIGINT ignored, and children inherit that.
CHILD = """
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
try:  # ready is said inside the try: a SIGINT right after it is still the one caught
    print(f"child ready {os.getpid()} {os.getpgid(0)}", flush=True)
    time.sleep(60)
except KeyboardInterrupt:
    print("child got SIGINT", flush=True)
    sys.exit(7)
"""

HARNESS = """
import os, sys
from perfdiag.local.training import SignalForwarding, TrainingProcess
training = TrainingProcess([sys.executable, "-c", sys.argv[1]], dict(os.environ),
                           stdout_to_stderr=False)
with SignalForwarding(training) as signals:
    while (code := training.wait(0.1)) is None:
        pass
print(f"parent: child exit {code}, signal {signals.received}", flush=True)
print("tail:", training.tail.lines(), flush=True)
"""


def _start_harness() -> tuple[subprocess.Popen[str], int, int]:
    harness = subprocess.Popen(
        [sys.executable, "-c", HARNESS, CHILD], stdout=subprocess.PIPE, text=True
    )
    assert harness.stdout is not None
    line = harness.stdout.readline()
    assert line.startswith("child ready"), line
    _, _, pid, pgid = line.split()
    return harness, int(pid), int(pgid)


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists() or " Z " in _stat(pid):
            return True
        time.sleep(0.05)
    return False


def _stat(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return " Z "


def test_sigint_is_forwarded_once_to_the_training_group() -> None:
    harness, child_pid, child_pgid = _start_harness()
    assert child_pgid == child_pid  # its own group: a terminal's Ctrl-C reaches only perfdiag
    assert child_pgid != os.getpgid(harness.pid)
    harness.send_signal(signal.SIGINT)
    out, _ = harness.communicate(timeout=30)
    assert "child got SIGINT" in out
    assert f"parent: child exit 7, signal {int(signal.SIGINT)}" in out
    assert "'child got SIGINT'" in out.split("tail:")[1]  # kept for error messages
    assert harness.returncode == 0


def test_training_does_not_outlive_perfdiag() -> None:
    harness, child_pid, _ = _start_harness()
    harness.kill()  # SIGKILL: perfdiag gets no chance to clean up
    harness.wait(timeout=10)
    assert _gone(child_pid, within_s=10)
