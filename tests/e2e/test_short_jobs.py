"""Short and fast jobs are diagnosed: in a local run the plan exists before step 1, so every
rank's window begins right after --warmup-steps steps at any step rate, and a job that is too
short is told which options fit it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from perfdiag.local.demo.scenarios import TRAIN_SCRIPT


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "steps", "warmup", "capture"),
    [
        ("fast", 30, 3, 5),  # about a millisecond a step
        ("fast", 10, 2, 5),
        ("demo", 10, 2, 5),  # tens of milliseconds a step
        ("demo", 10, 2, 7),  # exactly what the advice for a 10-step job says
    ],
)
def test_a_short_job_is_diagnosed_from_the_step_after_its_warm_up(
    script: str,
    steps: int,
    warmup: int,
    capture: int,
    tmp_path: Path,
    perfdiag: Any,
    scripts: Path,
    verdict_of: Any,
) -> None:
    out = tmp_path / "diag"
    target = (
        [str(scripts / "fast_train.py"), "--steps", str(steps)]
        if script == "fast"
        else [str(TRAIN_SCRIPT), "--steps", str(steps), "--min-seconds", "0"]
    )
    result = perfdiag(
        "run", "--nproc-per-node", "2", "--warmup-steps", str(warmup),
        "--capture-steps", str(capture), "--out", str(out), "--", *target,
        cwd=tmp_path,
    )  # fmt: skip
    assert result.code == 0, result.explain()
    verdict = verdict_of(out)
    # Steps count from 0 (as ProfilerStep#n): `warmup` steps, the profiler's warm-up step,
    # then the captured ones, on every rank.
    assert verdict.window.start_step == warmup + 1, verdict.to_json()
    assert verdict.window.steps == capture
    assert [w.state for w in verdict.workers] == ["ok", "ok"]
    assert f"every rank captures steps {warmup + 1}–{warmup + capture}" in result.stderr
    assert "began at different steps" not in result.stderr
    # The rank processes were sampled from their start, so even a window over in a fraction of
    # a second has its CPU accounting.
    assert (out / "workers" / "0" / "hardware.parquet").exists()
    assert verdict.workers[0].rank == 0
