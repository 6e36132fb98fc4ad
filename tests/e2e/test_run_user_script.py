"""`perfdiag run` on an unmodified torchrun script, then `perfdiag analyze` of its output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from perfdiag.api import Verdict


def _essence(verdict: Verdict) -> dict[str, Any]:
    return {
        "status": verdict.status,
        "summary": verdict.summary,
        "window": verdict.window.model_dump(),
        "workers": [w.model_dump() for w in verdict.workers],
        "findings": [
            (f.kind, f.category, f.function, f.ranks, round(f.severity, 6))
            for f in verdict.findings
        ],
    }


@pytest.mark.slow
def test_run_unmodified_script_then_reanalyze(
    tmp_path: Path, perfdiag: Any, verdict_of: Any, scripts: Path
) -> None:
    out = tmp_path / "diag"
    script = scripts / "user_train.py"
    result = perfdiag(
        "run",
        "--nproc-per-node",
        "4",
        "--out",
        str(out),
        "--json",
        "--",
        str(script),
        "--lr",
        "0.1",
        cwd=tmp_path,
    )
    assert result.code == 0, result.explain()
    # --json: stdout holds the verdict alone; the training's own output went to stderr, and the
    # training ran to its end after the window.
    printed = Verdict.model_validate(json.loads(result.stdout))
    assert "epoch 3 loss" in result.stderr
    # The default window: 5 warm-up steps (0–4), the profiler's warm-up step 5, steps 6–15.
    assert "4 ranks running: every rank captures steps 6–15 (step 5 warms" in result.stderr

    verdict = verdict_of(out)
    assert printed == verdict
    assert [w.rank for w in verdict.workers] == [0, 1, 2, 3]
    assert verdict.window.steps == 10
    for rank in range(4):
        for name in ("summary.parquet", "events.parquet", "status.json"):
            assert (out / "workers" / str(rank) / name).is_file(), (rank, name)
    assert (out / "plan.json").is_file()
    report = (out / "report.html").read_text()
    assert report.lstrip().lower().startswith("<!doctype html") and "<svg" in report

    again = tmp_path / "again"
    analyzed = perfdiag("analyze", str(out), "--out", str(again), "--json", cwd=tmp_path)
    assert analyzed.code == 0, analyzed.explain()
    reanalyzed = verdict_of(again)
    assert _essence(reanalyzed) == _essence(verdict)
    assert Verdict.model_validate(json.loads(analyzed.stdout)) == reanalyzed
    assert (again / "report.html").is_file()

    human = perfdiag("analyze", str(out), "--quiet", cwd=tmp_path)
    assert human.code == 0, human.explain()
    assert human.stdout.startswith(f"perfdiag verdict: {verdict.status.upper()}")
    assert str(out / "report.html") in human.stdout
