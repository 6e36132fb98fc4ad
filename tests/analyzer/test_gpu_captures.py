"""Real GPU fault captures (tests/data/gpu-captures: a GPT-style transformer trained with DDP
over gloo by two ranks on one GPU, one fault on rank 1 per run, each taken through `perfdiag
run` by scripts/gpu-check.sh) judged again as `perfdiag analyze` judges them: each must give the
verdict its expected.json states (docs/analysis.md "GPU capture suite"), healthy runs and runs
whose fault cost less than the reporting threshold without a finding, and every verdict's
numbers must agree between its messages, summary, terminal and report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perfdiag.analyzer import analyze
from perfdiag.storage.local import LocalStorage
from perfdiag_testing.gpu_captures import judge
from perfdiag_testing.verdict_agreement import disagreements

CAPTURES = Path(__file__).resolve().parents[1] / "data" / "gpu-captures"
RUNS = sorted(p for p in CAPTURES.iterdir() if (p / "expected.json").is_file())


def test_the_gpu_capture_suite_is_there() -> None:
    # Every class of benchmarks/gpu_transformer_train.py at least once, healthy runs among them.
    scenarios = {json.loads((p / "expected.json").read_text())["scenario"] for p in RUNS}
    assert len(scenarios) >= 16 and "healthy" in scenarios, sorted(scenarios)


@pytest.mark.parametrize("run", RUNS, ids=[p.name for p in RUNS])
def test_a_gpu_capture_gets_its_verdict(run: Path, tmp_path: Path) -> None:
    verdict = analyze(str(run), LocalStorage(tmp_path))
    right, why = judge(
        json.loads((run / "expected.json").read_text()), verdict.model_dump(mode="json")
    )
    assert right, f"{why}: {verdict.summary}"
    assert not disagreements(verdict, (tmp_path / "report.html").read_text())


RAW = Path(__file__).resolve().parents[1] / "data" / "gpu-traces-h100"


@pytest.mark.parametrize("name", ["healthy-1", "fp32-1"])
def test_the_raw_traces_of_a_capture_give_its_verdict(name: str, tmp_path: Path) -> None:
    # The same windows as the captures of the same name, as torch.profiler wrote them
    # (`perfdiag run --spool`): a Kineto folder read by perfdiag's own import, judged the same.
    verdict = analyze(str(RAW / name), LocalStorage(tmp_path))
    expected = json.loads((CAPTURES / name / "expected.json").read_text())
    right, why = judge(expected, verdict.model_dump(mode="json"))
    assert right, f"{why}: {verdict.summary}"
    assert not disagreements(verdict, (tmp_path / "report.html").read_text())
