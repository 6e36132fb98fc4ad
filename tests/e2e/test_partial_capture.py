"""A rank whose window cannot be captured: the verdict of the others, status incomplete, the
rank named as missing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.mark.slow
def test_rank_without_window_makes_an_incomplete_verdict(
    tmp_path: Path, perfdiag: Any, verdict_of: Any, scripts: Path
) -> None:
    out = tmp_path / "diag"
    result = perfdiag(
        "run", "--nproc-per-node", "4", "--out", str(out),
        "--", str(scripts / "busy_profiler_train.py"),
        cwd=tmp_path,
    )  # fmt: skip
    assert result.code == 0, result.explain()
    assert "perfdiag: rank 3: no usable window (the hook could not capture" in result.stderr
    verdict = verdict_of(out)
    assert verdict.status == "incomplete", verdict.to_json()
    states = {w.rank: w.state for w in verdict.workers}
    assert states == {0: "ok", 1: "ok", 2: "ok", 3: "missing"}, verdict.to_json()
    assert "3" in verdict.summary
    assert "perfdiag verdict: INCOMPLETE" in result.stdout
    assert "workers not captured: rank 3 missing" in result.stdout
