"""`perfdiag analyze`: errors (a SOURCE with no capture, or no SOURCE at all), reading trace
files side by side, and what the command imports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from perfdiag_testing.synthetic_trace import TraceFault, TraceJob


def test_folder_without_capture_exits_5(cli: Any, tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a capture")
    code, out, err = cli("analyze", str(tmp_path))
    assert code == 5
    assert f"{tmp_path} holds no capture" in err
    assert out == ""
    assert not (tmp_path / "verdict.json").exists()


def test_missing_source_exits_1(cli: Any, tmp_path: Path) -> None:
    code, _, err = cli("analyze", str(tmp_path / "nothing-here"))
    assert code == 1
    assert "does not exist" in err


def test_file_source_exits_1(cli: Any, tmp_path: Path) -> None:
    (tmp_path / "f.json").write_text("{}")
    code, _, err = cli("analyze", str(tmp_path / "f.json"))
    assert code == 1
    assert "is not a folder" in err


@pytest.fixture(scope="module")
def kineto_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four ranks of Kineto traces, rank 2 a compute straggler, over two pipeline stages (so
    that peers are grouped by the collectives each rank issues)."""
    folder = tmp_path_factory.mktemp("kineto")
    TraceJob(
        n_ranks=4,
        n_steps=6,
        pipeline_stages=2,
        faults=[TraceFault("compute_straggler", (2,), factor=1.6)],
    ).write(folder)
    return folder


def test_jobs_read_trace_files_side_by_side_to_the_same_verdict(
    cli: Any, kineto_folder: Path, tmp_path: Path
) -> None:
    verdicts = []
    for jobs in ("1", "3"):
        code, out, err = cli(
            "analyze", str(kineto_folder), "--out", str(tmp_path / jobs), "--jobs", jobs, "--json"
        )
        assert code == 0, err
        verdicts.append(json.loads(out))
        # Progress still comes in file order, whatever file finished first.
        summarized = [line for line in err.splitlines() if "summarized" in line]
        assert [line.split("summarized ")[1] for line in summarized] == [
            f"{i + 1}/4 traces (rank {i})" for i in range(4)
        ]
    assert verdicts[0]["findings"][0]["ranks"] == [2]
    assert verdicts[0] == verdicts[1]
    assert (tmp_path / "1" / "timeline.json.gz").read_bytes() != b""


@pytest.mark.parametrize("jobs", ["0", "-2", "two", "257"])
def test_jobs_out_of_range_is_a_usage_error(cli: Any, kineto_folder: Path, jobs: str) -> None:
    code, _, err = cli("analyze", str(kineto_folder), "--jobs", jobs)
    assert code == 2
    assert "--jobs" in err


# Modules the analysis of a trace folder never needs: training, the cluster, S3 (local files),
# and Arrow's query engine, datasets and Parquet (the first group_by would import them).
NOT_IMPORTED = (
    "torch",
    "kopf",
    "kubernetes",
    "minio",
    "pyarrow.acero",
    "pyarrow.dataset",
    "pyarrow.parquet",
)


@pytest.mark.parametrize("link_gbps", [80.0, 3.0])
def test_analyze_imports_only_what_it_uses(tmp_path: Path, link_gbps: float) -> None:
    # At 3 GB/s every rank spends most of its step communicating: an expected-range finding,
    # whose top functions are summed per function.
    TraceJob(n_ranks=4, n_steps=6, pipeline_stages=2, link_gbps=link_gbps).write(tmp_path / "in")
    code = (
        "import json, sys\n"
        "from perfdiag.cli import main\n"
        f"assert main(['analyze', {str(tmp_path / 'in')!r}, '--out', {str(tmp_path)!r},"
        " '--quiet', '--json']) == 0\n"
        f"print([m for m in {NOT_IMPORTED!r} if m in sys.modules])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd="/", timeout=120
    )
    assert done.returncode == 0, done.stderr
    *verdict, imported = done.stdout.strip().splitlines()
    observed = {f["kind"] for f in json.loads("\n".join(verdict)).get("observations", [])}
    assert ("expected_range" in observed) == (link_gbps < 10), observed
    assert imported == "[]"
