"""scripts/gpu-check.sh and its training job, without a GPU: every scenario of
benchmarks/gpu_transformer_train.py runs on CPU (2 ranks, gloo), the script parses, a dry run of
the script packs what the GPU machine would send back, and that comes back in as test data."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from perfdiag_testing import gpu_captures

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "benchmarks" / "gpu_transformer_train.py"
GPU_CHECK = ROOT / "scripts" / "gpu-check.sh"
GPU_CLASSES = {
    "healthy", "fp32", "tf32-off", "seq2x", "microbatch", "activation-checkpointing",
    "unfused-ops", "sync-every-block", "logits-to-host", "slow-h2d", "pinned-vs-pageable",
    "python-batch", "dataset-getitem", "empty-cache", "memory-hungry", "gpu-shared",
}  # fmt: skip


def _train_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_transformer_train", TRAIN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def test_every_scenario_documents_its_expected_verdict() -> None:
    train = _train_module()
    assert set(train.SCENARIOS) == GPU_CLASSES
    for name in GPU_CLASSES:
        assert f"\n  {name} " in (train.__doc__ or ""), f"{name} missing from the docstring"
        one_gpu = train.expected_verdict(name, gpus=1)
        if name == "healthy":
            assert one_gpu["culprits"] == [] and one_gpu["status"] == "healthy"
        elif name == "gpu-shared":
            # Both ranks share the GPU the other process runs on: nobody stands out.
            assert one_gpu["culprits"] == []
            own_gpu = train.expected_verdict(name, gpus=2)
            assert own_gpu["culprits"] == [1]
            assert set(own_gpu["categories"]) == {"gpu_compute", "gpu_hardware"}
        else:
            assert one_gpu["culprits"] == [1] and one_gpu["status"] == "degraded"
            assert one_gpu["categories"], name
            assert not {"host", "communication"} & set(one_gpu["categories"]), name


@pytest.mark.slow
def test_every_scenario_trains_on_cpu_with_two_ranks() -> None:
    """Each scenario's code path in one process group, a fresh model each: the CUDA-only calls
    are skipped on CPU, the other process of gpu-shared starts and is gone at the end."""
    steps = 4
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(TRAIN), "--device", "cpu", "--steps", str(steps),
         "--scenario", ",".join(sorted(GPU_CLASSES))],
        capture_output=True, text=True, timeout=300, env=_env(), check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    for name in GPU_CLASSES:
        for rank in (0, 1):
            assert any(f"_train: {name} rank {rank}: {steps} steps" in line for line in lines), (
                name,
                rank,
                proc.stdout[-3000:],
            )
    fault_notes = "\n".join(line for line in lines if " rank 1: " in line)
    assert "rounds per token" in fault_notes  # python-batch, dataset-getitem calibrated
    assert "MiB per step" in fault_notes  # slow-h2d, pinned-vs-pageable
    hog = [line for line in lines if "other process" in line]
    assert len(hog) == 1, proc.stdout[-3000:]
    pid = int(hog[0].split("other process ")[1].split()[0])
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_gpu_check_script_parses() -> None:
    subprocess.run(["bash", "-n", str(GPU_CHECK)], check=True)


@pytest.mark.slow
def test_gpu_check_dry_run_packs_captures_that_import_as_test_data(tmp_path: Path) -> None:
    """The script as the GPU machine runs it, on CPU: one scenario through `perfdiag run`, its
    summary line, the archives within bounds, then imported with its expected.json."""
    out = tmp_path / "out"
    env = {
        **_env(),
        "INSTALL": "0",
        "PYTHON": sys.executable,
        "SCENARIOS": "healthy",
        "REPEATS": "1",
        "TRAIN_ARGS": "--device cpu",
        "WARMUP_STEPS": "2",
        "CAPTURE_STEPS": "4",
        "RUN_TIMEOUT": "240",
        "TMPDIR": str(tmp_path),  # the script's working folder, removed with tmp_path
    }
    proc = subprocess.run(
        ["bash", str(GPU_CHECK), str(out)],
        capture_output=True, text=True, timeout=420, env=env, check=False,
    )  # fmt: skip
    summary = (out / "summary.txt").read_text()
    assert proc.returncode == 0, summary + proc.stderr[-2000:]
    run_line = next(line for line in summary.splitlines() if line.startswith("healthy #1:"))
    assert "exit 0" in run_line and "; top: " in run_line, summary
    files = sorted(p.name for p in out.iterdir())
    assert files == ["captures-1.tar.gz", "summary.txt", "traces.tar.gz"], files
    assert all((out / f).stat().st_size <= gpu_captures.PART_BYTES for f in files)
    with tarfile.open(out / "captures-1.tar.gz") as tar:
        names = set(tar.getnames())
    for rank in (0, 1):
        for part in ("summary.parquet", "hardware.parquet", "events.parquet"):
            assert f"runs/healthy-1/workers/{rank}/{part}" in names
    with tarfile.open(out / "traces.tar.gz") as tar:
        assert any(n.endswith("trace.json.gz") for n in tar.getnames())

    data = tmp_path / "gpu-captures"
    lines = gpu_captures.import_archives([out / "captures-1.tar.gz"], data)
    assert len(lines) == 1 and lines[0].startswith("healthy-1: imported"), lines
    expected = json.loads((data / "healthy-1" / "expected.json").read_text())
    assert expected["status"] == "healthy" and expected["culprits"] == []
    assert (data / "healthy-1" / "plan.json").is_file()
    assert json.loads((data / "healthy-1" / "run.json").read_text())["rc"] == 0


def _fake_run(runs: Path, name: str, repeat: int, order: int, events_bytes: int) -> None:
    """A run folder with the files of a capture (contents irrelevant to packing)."""
    run = runs / name
    (run / "workers").mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"scenario": name, "repeat": repeat, "order": order}))
    (run / "plan.json").write_text("{}")
    (run / "verdict.json").write_text("{}")
    for rank in (0, 1):
        worker = run / "workers" / str(rank)
        worker.mkdir()
        (worker / "summary.parquet").write_bytes(os.urandom(20_000))
        (worker / "hardware.parquet").write_bytes(os.urandom(30_000))
        (worker / "events.parquet").write_bytes(os.urandom(events_bytes))


def test_pack_fills_bounded_archives_most_needed_first(tmp_path: Path) -> None:
    runs, logs, dest = tmp_path / "runs", tmp_path / "logs", tmp_path / "dest"
    logs.mkdir()
    (logs / "runaway.log").write_bytes(b"x" * (gpu_captures.LOG_TAIL_BYTES + 5000) + b"END")
    for order, (name, repeat) in enumerate([("a-1", 1), ("b-1", 1), ("a-2", 2), ("b-2", 2)]):
        _fake_run(runs, name, repeat, order, events_bytes=300_000)
    # Room for three archives of 700 kB: every core file and the first repeats' events fit,
    # the second repeats' do not.
    notes = gpu_captures.pack(runs, dest, logs=logs, part_bytes=700_000, max_files=4)
    archives = sorted(dest.glob("captures-*.tar.gz"))
    assert len(archives) == 3
    members: dict[str, Any] = {}
    for archive in archives:
        assert archive.stat().st_size <= 700_000
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                members[member.name] = member
    for name in ("a-1", "b-1", "a-2", "b-2"):
        assert f"runs/{name}/workers/1/summary.parquet" in members
        assert f"runs/{name}/workers/1/hardware.parquet" in members
    assert "runs/a-1/workers/0/events.parquet" in members
    assert "runs/b-2/workers/0/events.parquet" not in members
    assert any("b-2: events left out" in note for note in notes), notes
    assert members["logs/runaway.log"].size == gpu_captures.LOG_TAIL_BYTES


def test_judge_names_every_culprit_with_its_cause() -> None:
    expected = {"culprits": [1], "categories": ["gpu_memory"], "functions": ["Memcpy DtoH"]}
    finding = {"kind": "slow_worker", "ranks": [1], "category": "gpu_memory", "severity": 0.1,
               "function": "Memcpy DtoH (Device -> Pageable)"}  # fmt: skip
    assert gpu_captures.judge(expected, {"status": "degraded", "findings": [finding]})[0]
    wrong_rank = {**finding, "ranks": [0]}
    assert not gpu_captures.judge(expected, {"status": "degraded", "findings": [wrong_rank]})[0]
    wrong_function = {**finding, "function": "Memcpy HtoD (Pageable -> Device)"}
    assert not gpu_captures.judge(expected, {"status": "degraded", "findings": [wrong_function]})[0]
    healthy: dict[str, list[str]] = {"culprits": [], "categories": [], "functions": []}
    assert gpu_captures.judge(healthy, {"status": "healthy", "findings": []})[0]
    assert not gpu_captures.judge(healthy, {"status": "degraded", "findings": [finding]})[0]
