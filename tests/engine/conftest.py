"""Shared helpers of the engine tests: real traces, a real spool, hand-built event tables."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from perfdiag.api.schema import EVENTS_SCHEMA

HERE = Path(__file__).resolve().parent
HTA_TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "hta"
SPOOL_WRITER = HERE / "spool_writer.py"
CORPUS = HERE / "corpus"


def hta_trace_files() -> list[Path]:
    return sorted(HTA_TRACES.rglob("*.json.gz"))


@pytest.fixture(scope="session")
def hta_files() -> list[Path]:
    files = hta_trace_files()
    assert files, f"no Kineto traces under {HTA_TRACES} (the shared HTA traces are required)"
    return files


def write_spool(
    spool: Path, plan_id: str, *extra: str, nproc: int = 1, timeout: float = 300
) -> None:
    """Run the spool writer (a real torch.profiler loop) — under torchrun with gloo when
    nproc > 1."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    script = [str(SPOOL_WRITER), str(spool), "--plan-id", plan_id, *extra]
    if nproc > 1:
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nproc}",
            *script,
        ]
    else:
        command = [sys.executable, *script]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (
        f"spool writer failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )


@pytest.fixture(scope="session")
def real_spool(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One rank's spool with a completed window "p1": first step 3 (warm-up), steps 4..7, a
    gc.collect() in step 5, Python stacks on."""
    spool = tmp_path_factory.mktemp("spool")
    write_spool(spool, "p1", "--first-step", "3", "--steps", "4", "--gc-step", "5", "--stacks")
    return spool


@pytest.fixture()
def spool_copy(real_spool: Path, tmp_path: Path) -> Iterator[Path]:
    """A private copy of the real spool (tests that add markers or break files)."""
    import shutil

    copy = tmp_path / "spool"
    shutil.copytree(real_spool, copy)
    yield copy


def events_table(rows: list[dict[str, Any]]) -> pa.Table:
    """An EVENTS_SCHEMA table from short rows: name, category, kineto_cat, ts, dur, tid and
    optionally pid (default 1), device (default null)."""
    columns: dict[str, list[Any]] = {field.name: [] for field in EVENTS_SCHEMA}
    for row in rows:
        full = {
            "rank": 0,
            "pid": 1,
            "device": None,
            "stream": None,
            "step": 0,
            "correlation": None,
            "collective": None,
            "msg_bytes": None,
            "group_size": None,
            "pg_name": None,
            "seq": None,
            "dtype": None,
            "pg_ranks": None,
            "out_msg_bytes": None,
            **row,
        }
        full.setdefault("ts_ns", full.pop("ts", None))
        full.setdefault("dur_ns", full.pop("dur", None))
        full.pop("ts", None)
        full.pop("dur", None)
        for name in columns:
            columns[name].append(full[name])
    return pa.table(columns, schema=EVENTS_SCHEMA)


@pytest.fixture(scope="session")
def make_events() -> Any:
    """`events_table` for tests (helpers reach tests as fixtures under importlib imports)."""
    return events_table


@pytest.fixture(scope="session")
def spool_writer() -> Any:
    """`write_spool` for tests."""
    return write_spool
