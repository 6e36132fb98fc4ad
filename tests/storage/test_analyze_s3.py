"""`perfdiag analyze s3://…` end to end: the real CLI, credentials from the standard variables,
real torch.profiler traces in MinIO, the verdict written back next to them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from perfdiag.storage.s3 import S3Storage
from perfdiag_testing.minio_server import MinioServer

pytestmark = pytest.mark.cluster

# Two ranks of a real job, from HTA's test data (../shared/traces/hta, docs/design.md §6).
TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "hta" / "trace_filter"
PERFDIAG = str(Path(sys.executable).with_name("perfdiag"))


def _analyze(source: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PERFDIAG, "analyze", source, "--json", "--quiet"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _essentials(verdict: dict[str, Any]) -> dict[str, Any]:
    """What must not depend on where the capture was read from."""
    return {
        "status": verdict["status"],
        "window": verdict["window"],
        "workers": [(w["rank"], w["state"]) for w in verdict["workers"]],
        "missing": verdict.get("missing", []),
        "findings": [
            (f["kind"], f["category"], f["function"], f["ranks"]) for f in verdict["findings"]
        ],
    }


def test_analyze_reads_and_writes_s3(
    minio_server: MinioServer, s3_prefix: str, tmp_path: Path
) -> None:
    traces = sorted(TRACES.glob("*.json.gz"))
    assert len(traces) == 2, f"expected the HTA sample traces in {TRACES}"
    storage = S3Storage.from_uri(s3_prefix, minio_server.env())
    for trace in traces:
        storage.put_file(trace.name, trace)

    # Only the standard variables tell the CLI where and who: nothing else is passed.
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    result = _analyze(s3_prefix, {**env, **minio_server.env()})
    assert result.returncode == 0, result.stderr
    verdict = json.loads(result.stdout)
    assert verdict["schema"] == "perfdiag.verdict/v1"
    assert json.loads(storage.get_text("verdict.json")) == verdict
    assert storage.exists("report.html")
    assert b"<html" in storage.get_bytes("report.html").lower()

    # The same traces analyzed from a local folder give the same diagnosis.
    local = tmp_path / "local"
    local.mkdir()
    for trace in traces:
        shutil.copy(trace, local / trace.name)
    local_result = _analyze(str(local), env)
    assert local_result.returncode == 0, local_result.stderr
    assert _essentials(json.loads(local_result.stdout)) == _essentials(verdict)


def test_analyze_reports_rejected_credentials_without_a_traceback(
    minio_server: MinioServer, s3_prefix: str
) -> None:
    env = {**os.environ, **minio_server.env(), "AWS_SECRET_ACCESS_KEY": "wrong-secret"}
    result = _analyze(s3_prefix, env)
    assert result.returncode == 1, result.stderr
    assert "rejected the credentials" in result.stderr
    assert "AWS_SECRET_ACCESS_KEY" in result.stderr
    assert "Traceback" not in result.stderr
