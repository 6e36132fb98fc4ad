"""The Argo CD health check (docs/gitops/perfdiagnosis-health.lua) run by a real Lua 5.4
interpreter (Debian's lua5.4, installed by scripts/setup.sh), the way Argo CD runs it: the
object as the global `obj`, the script's returned table as the health."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.gitops.phases import CASES, Case

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "docs" / "gitops" / "perfdiagnosis-health.lua"
ARGO_STATUSES = {"Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown"}


def _lua_string(text: str) -> str:
    out = []
    for byte in text.encode():
        char = chr(byte)
        if char.isalnum() or char in " .,:;_-/()[]{}=+*!?'<>@#":
            out.append(char)
        else:
            out.append(f"\\{byte:03d}")
    return '"' + "".join(out) + '"'


def lua_literal(value: Any) -> str:
    """A Lua table constructor for a JSON-like value (what Argo CD hands the script)."""
    if isinstance(value, dict):
        return (
            "{"
            + ", ".join(f"[{_lua_string(k)}] = {lua_literal(v)}" for k, v in value.items())
            + "}"
        )
    if isinstance(value, list):
        return "{" + ", ".join(lua_literal(v) for v in value) + "}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if value is None:
        return "nil"
    return _lua_string(str(value))


def argo_health(obj: dict[str, Any]) -> tuple[str, str]:
    lua = shutil.which("lua5.4")
    assert lua, "lua5.4 is missing: run scripts/setup.sh (it installs Debian's lua5.4)"
    program = (
        f"obj = {lua_literal(obj)}\n"
        f"local hs = assert(loadfile({_lua_string(str(SCRIPT))}))()\n"
        'io.write(hs.status, "\\n", hs.message or "")\n'
    )
    result = subprocess.run(
        [lua, "-"], input=program, capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stderr
    status, _, message = result.stdout.partition("\n")
    return status, message


@pytest.mark.parametrize("degrade", ["", "on-failure", "on-finding"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_health_of_each_state(case: Case, degrade: str) -> None:
    status, message = argo_health(case.obj(degrade))
    assert status in ARGO_STATUSES
    assert status == case.argo[degrade], message
    assert message


def test_a_failed_diagnosis_leaves_the_app_healthy_by_default_and_says_why() -> None:
    failed = next(c for c in CASES if c.name == "failed, analyzer failed")
    assert argo_health(failed.obj()) == ("Healthy", "diagnosis failed: AnalyzerFailed message")


def test_verdict_is_the_message_of_a_finished_diagnosis() -> None:
    done = next(c for c in CASES if c.name == "succeeded, degraded verdict")
    assert argo_health(done.obj()) == ("Healthy", "degraded: rank 3 is slow")


def test_an_unknown_annotation_value_does_not_degrade() -> None:
    failed = next(c for c in CASES if c.name == "failed, analyzer failed")
    assert argo_health(failed.obj("yes"))[0] == "Healthy"
