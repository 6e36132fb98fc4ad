"""The ranks' environment: the hook first on PYTHONPATH, the user's path kept after it."""

from __future__ import annotations

import os
from pathlib import Path

from perfdiag.local.runner import training_env


def test_hook_comes_first_and_user_path_is_kept(tmp_path: Path) -> None:
    env = training_env(
        {"PYTHONPATH": "/user/a:/user/b", "HOME": "/h"},
        tmp_path / "hook",
        tmp_path / "spool",
        tmp_path / "spool" / "plan.json",
    )
    assert env["PYTHONPATH"].split(os.pathsep) == [str(tmp_path / "hook"), "/user/a", "/user/b"]
    assert env["PERFDIAG_SPOOL"] == str(tmp_path / "spool")
    assert env["PERFDIAG_PLAN"] == str(tmp_path / "spool" / "plan.json")
    assert env["HOME"] == "/h"


def test_without_user_path(tmp_path: Path) -> None:
    env = training_env({}, tmp_path / "hook", tmp_path, tmp_path / "plan.json")
    assert env["PYTHONPATH"] == str(tmp_path / "hook")
    assert env["PYTHONUNBUFFERED"] == "1"
    assert (
        training_env({"PYTHONUNBUFFERED": ""}, tmp_path, tmp_path, tmp_path)["PYTHONUNBUFFERED"]
        == ""
    )
