"""Helpers for the end-to-end tests: real `perfdiag` processes running real gloo training."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from perfdiag.api import Verdict

HERE = Path(__file__).resolve().parent
USER_SCRIPT = HERE / "user_train.py"


@dataclass
class Completed:
    code: int
    stdout: str
    stderr: str
    seconds: float

    def explain(self) -> str:
        return f"exit {self.code} after {self.seconds:.0f} s\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"


def run_perfdiag(*argv: str, cwd: Path, timeout_s: float = 300.0) -> Completed:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "perfdiag.cli", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    return Completed(result.returncode, result.stdout, result.stderr, time.monotonic() - started)


def read_verdict(out: Path) -> Verdict:
    return Verdict.model_validate(json.loads((out / "verdict.json").read_text()))


@pytest.fixture
def perfdiag() -> Any:
    """run_perfdiag(*argv, cwd=..., timeout_s=...) → Completed."""
    return run_perfdiag


@pytest.fixture
def verdict_of() -> Any:
    """verdict_of(out_folder) → the Verdict in its verdict.json."""
    return read_verdict


@pytest.fixture
def scripts() -> Path:
    """The folder of the test training scripts."""
    return HERE
