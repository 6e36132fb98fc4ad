"""Checks made before anything is launched: the training entry point exists."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from perfdiag.local.errors import CliError
from perfdiag.local.torchrun import LaunchTarget


def check_target(target: LaunchTarget, env: dict[str, str]) -> None:
    """Raise CliError (exit 1) when torchrun would not find what it is asked to run."""
    if target.no_python:
        if shutil.which(target.entry, path=env.get("PATH")) is None and not _is_executable(
            Path(target.entry)
        ):
            raise CliError(f"program not found or not executable: {target.entry}")
        return
    if target.module:
        if not _module_exists(target.entry, env):
            raise CliError(
                f"module not found: {target.entry} (looked on PYTHONPATH and in {Path.cwd()})"
            )
        return
    path = Path(target.entry)
    if not path.exists():
        raise CliError(f"training script not found: {target.entry} (in {Path.cwd()})")
    if not path.is_file():
        raise CliError(f"training script is not a file: {target.entry}")
    if not os.access(path, os.R_OK):
        raise CliError(f"training script is not readable: {target.entry}")


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _module_exists(name: str, env: dict[str, str]) -> bool:
    # In a child with the training's environment: `python -m` looks in the current folder and
    # on the user's PYTHONPATH, and finding a submodule imports its parent packages.
    code = "import importlib.util, sys; sys.exit(importlib.util.find_spec(sys.argv[1]) is None)"
    try:
        result = subprocess.run(
            [sys.executable, "-c", code, name],
            env=env,
            capture_output=True,
            timeout=60,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return True  # undecided: let torchrun report it
    return result.returncode == 0
