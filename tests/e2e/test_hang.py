"""`perfdiag run` on a training that hangs: it notices, dumps every rank's stacks, prints a
`hang` verdict naming the rank that holds the job up, stops the training and exits 7 — and a
job that is merely slow is not called a hang. Real 4-rank gloo jobs on the CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from perfdiag.local.hang import EXIT_HANG


def _hang_run(perfdiag: Any, scripts: Path, tmp_path: Path, *options: str) -> Any:
    out = tmp_path / "diag"
    result = perfdiag(
        "run", "--nproc-per-node", "4", "--out", str(out), "--hang-after", "4", "--json",
        *options, cwd=tmp_path, timeout_s=240,
    )  # fmt: skip
    return out, result


@pytest.mark.slow
def test_rank_blocked_before_all_reduce_is_named(
    tmp_path: Path, perfdiag: Any, verdict_of: Any, scripts: Path
) -> None:
    # Rank 2 blocks at step 3, before the warm-up ends: no capture window ever starts.
    out, result = _hang_run(
        perfdiag, scripts, tmp_path, "--", str(scripts / "hang_train.py"),
        "--mode", "before-allreduce", "--rank", "2", "--at-step", "3",
    )  # fmt: skip
    assert result.code == EXIT_HANG, result.explain()
    assert "the training is stuck" in result.stderr
    assert "perfdiag stopped it" in result.stderr
    verdict = verdict_of(out)
    assert verdict.status == "hang", verdict.to_json()
    hang = verdict.findings[0]
    assert hang.kind == "hang"
    assert hang.ranks == [2], verdict.to_json()
    assert hang.evidence["waiting"]["ranks"] == [0, 1, 3]
    assert hang.evidence["waiting"]["collective"] == "all_reduce"
    stack = hang.evidence["culprits"][0]["stack"]
    assert any("hang_train.py" in frame and "main" in frame for frame in stack), stack
    assert {w.rank: w.state for w in verdict.workers} == {r: "stuck" for r in range(4)}
    # The Flight Recorder (on by default in this torch, gloo included) agrees.
    assert "flight_recorder" in hang.evidence, hang.evidence.keys()
    assert "Rank 2 is holding up the job" in verdict.summary


@pytest.mark.slow
def test_rank_blocked_in_its_data_loader_is_named_with_the_loader_frame(
    tmp_path: Path, perfdiag: Any, verdict_of: Any, scripts: Path
) -> None:
    # Rank 1 blocks inside its DataLoader at step 600, well after the window (which begins
    # about 2 s of steps after the 2 warm-up steps): the window's verdict is printed first,
    # then perfdiag keeps watching while the training goes on.
    out, result = _hang_run(
        perfdiag, scripts, tmp_path, "--warmup-steps", "2", "--capture-steps", "3",
        "--", str(scripts / "hang_train.py"), "--mode", "dataloader", "--rank", "1",
        "--at-step", "600", "--steps", "5000",
    )  # fmt: skip
    assert "waiting for the training to finish" in result.stderr, result.explain()
    assert result.stderr.index("waiting for the training to finish") < result.stderr.index(
        "the training is stuck"
    )
    assert result.code == EXIT_HANG, result.explain()
    verdict = verdict_of(out)
    assert verdict.status == "hang", verdict.to_json()
    hang = verdict.findings[0]
    assert hang.kind == "hang" and hang.ranks == [1], verdict.to_json()
    assert hang.category == "dataloader"
    culprit = hang.evidence["culprits"][0]
    assert any("torch/utils/data/" in frame for frame in culprit["stack"]), culprit
    assert any("read_shard_blocking" in frame for frame in culprit["stack"]), culprit
    assert "read_shard_blocking" in (culprit["location"] or "")
    assert hang.evidence["waiting"]["ranks"] == [0, 2, 3]
    # The window before the hang was analysed: the ranks' summaries are in the capture.
    assert all((out / "workers" / str(r) / "summary.parquet").exists() for r in range(4))
    assert all((out / "workers" / str(r) / "hardware.parquet").exists() for r in range(4))


@pytest.mark.slow
def test_slow_job_with_a_long_step_is_not_a_hang(
    tmp_path: Path, perfdiag: Any, verdict_of: Any, scripts: Path
) -> None:
    # Steps of ~0.4 s and one 5 s pause on rank 3 (longer than --hang-after 4, shorter than
    # 20 median steps): slow, not stuck.
    out, result = _hang_run(
        perfdiag, scripts, tmp_path, "--warmup-steps", "3", "--capture-steps", "3",
        "--", str(scripts / "hang_train.py"), "--mode", "slow", "--rank", "3",
        "--at-step", "12", "--steps", "16", "--step-seconds", "0.4", "--pause-seconds", "5",
    )  # fmt: skip
    assert result.code == 0, result.explain()
    assert "the training is stuck" not in result.stderr
    verdict = verdict_of(out)
    assert verdict.status != "hang"
    assert all(w.state == "ok" for w in verdict.workers)
    # The window was sampled (host only here) and the summaries carry the CPU resource.
    samples = pq.read_table(out / "workers" / "3" / "hardware.parquet")
    metrics = set(samples.column("metric").to_pylist())
    assert {"net_rx_bytes", "cpu_total_jiffies", "cpu_run_ns"} <= metrics, metrics
    assert set(samples.column("rank").to_pylist()) == {3}
    summary = pq.read_table(out / "workers" / "3" / "summary.parquet")
    assert "cpu_run_fraction" in summary.column("resource").to_pylist()
