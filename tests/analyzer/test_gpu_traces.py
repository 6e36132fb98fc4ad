"""Real GPU traces judged as `perfdiag analyze` judges them: a GPT-2 DDP job of two ranks on one
H200 (../shared/traces/gpu-gpt2: healthy, and rank 1 training in fp32 instead of bf16
autocast). A healthy GPU job reads healthy, its whole-job efficiency shown as observations; a
GPU culprit is named to its kernels, and its peer on the same GPU is not named."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfdiag.analyzer import analyze
from perfdiag.api.verdict import Verdict
from perfdiag.local.verdict_text import render_verdict
from perfdiag.storage.local import LocalStorage
from perfdiag_testing.verdict_agreement import disagreements

GPT2 = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "gpu-gpt2"
CULPRIT_KINDS = {"slow_worker", "slow_node", "function_anomaly", "hardware", "hang"}


def _judge(name: str, tmp_path: Path) -> Verdict:
    folder = GPT2 / name
    assert len(list(folder.glob("rank-*.json.gz"))) == 2, (
        f"the shared GPU traces are required ({folder})"
    )
    verdict = analyze(str(folder), LocalStorage(tmp_path / name))
    report = (tmp_path / name / "report.html").read_text()
    assert not disagreements(verdict, report)
    return verdict


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> Verdict:
    return _judge("healthy", tmp_path_factory.mktemp("gpu"))


@pytest.fixture(scope="module")
def fp32(tmp_path_factory: pytest.TempPathFactory) -> Verdict:
    return _judge("fp32-rank1", tmp_path_factory.mktemp("gpu"))


def test_a_healthy_gpu_job_reads_healthy(healthy: Verdict) -> None:
    assert healthy.status == "healthy", healthy.summary
    assert not [f for f in healthy.findings if f.severity >= 0.05], healthy.findings
    assert healthy.summary.startswith("Both ranks look healthy")


def test_whole_job_efficiency_is_observed_not_blamed(healthy: Verdict) -> None:
    observed = {f.category: f for f in healthy.observations}
    # Gloo over one shared GPU, Python-heavy small model: the job's shape, said as advice.
    assert {"python", "communication"} <= set(observed)
    assert all(f.kind == "expected_range" for f in healthy.observations)
    assert "(advice, not a fault)" in healthy.summary
    # The training thread inside the autograd engine waits for its device threads: no Python.
    tops = [t["function"] for t in observed["python"].evidence["top_functions"]]
    assert not [t for t in tops if "run_backward" in t], tops
    text = render_verdict(healthy)
    assert "not a fault of any part" in text and "findings" not in text


def test_a_gpu_culprit_is_named_to_its_kernels(fp32: Verdict) -> None:
    assert fp32.status == "degraded"
    named = {r for f in fp32.findings if f.kind in CULPRIT_KINDS for r in f.ranks}
    # Rank 0 shares the GPU with rank 1: its host work shows where its own kernels end
    # sooner, which names no culprit.
    assert named == {1}, [(f.kind, f.category, f.ranks) for f in fp32.findings]
    top = fp32.findings[0]
    assert (top.kind, top.category, top.ranks) == ("slow_worker", "gpu_compute", [1])
    kernels = top.evidence["kernels"]
    assert kernels and all(k["ms_per_step"] > k["peers_median_ms_per_step"] for k in kernels)
    # Its fp32 kernels (f32 GEMMs and attention, single-precision sgemm), which the bf16 peer
    # does not run.
    assert all("f32" in k["kernel"] or "sgemm" in k["kernel"] for k in kernels), kernels
    assert all(k["peers_median_call_us"] is None for k in kernels)
    assert top.function == kernels[0]["kernel"]
    assert "Its GPU time grew in" in top.message


def test_a_number_given_twice_differently_is_caught(fp32: Verdict) -> None:
    top = fp32.findings[0]
    excess = top.evidence["workers"][0]["excess_ms_per_step"]
    wrong = top.model_copy(update={"message": top.message.replace(f"{excess:.1f} ms", "9.99 ms")})
    tampered = fp32.model_copy(update={"findings": [wrong, *fp32.findings[1:]]})
    assert any("lacks the excess" in p for p in disagreements(tampered, ""))
