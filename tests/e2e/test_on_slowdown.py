"""`perfdiag run --on-slowdown`: the training runs unobserved until it slows down, then one
window is captured on every rank and its verdict names the rank that turned slow."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.mark.slow
def test_a_slowdown_is_captured_once_and_named(
    tmp_path: Path, perfdiag: Any, scripts: Path, verdict_of: Any
) -> None:
    out = tmp_path / "diag"
    result = perfdiag(
        "run", "--nproc-per-node", "2", "--on-slowdown", "20%", "--max-captures", "2",
        "--capture-steps", "8", "--out", str(out), "--",
        str(scripts / "slow_from_train.py"), "--steps", "700", "--slow-from", "200",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.code == 0, result.explain()
    assert "slow-from job: 700 steps done" in result.stdout + result.stderr
    # One slowdown, one capture: the second allowed capture never fires (the new speed
    # becomes the baseline after the window), and the first verdict is printed once.
    assert result.stdout.count("perfdiag verdict:") == 1, result.explain()
    assert not (out / "capture-2").exists()
    verdict = verdict_of(out / "capture-1")
    assert verdict.trigger is not None and verdict.trigger.step > 200, verdict.to_json()
    assert verdict.trigger.percent_over >= 20
    culprits = {r for f in verdict.findings if f.kind == "slow_worker" for r in f.ranks}
    assert 1 in culprits, verdict.to_json()
    assert "captured on a slowdown: rank" in result.stdout
