"""Two real gloo DDP ranks, one doing extra work every step: the summaries must tell the culprit
(more time outside communication) from its victim (more time in communication)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest

from perfdiag.collector.agent import process_window
from perfdiag.engine.parquet_io import table_from_bytes
from perfdiag.storage.local import LocalStorage


def category_beta(storage: LocalStorage, rank: int) -> dict[str, float]:
    summary = table_from_bytes(storage.get_bytes(f"workers/{rank}/summary.parquet"))
    out: dict[str, float] = {}
    for row in summary.to_pylist():
        out[row["category"]] = out.get(row["category"], 0.0) + row["beta"]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["python", "aten"])
def test_culprit_and_victim(kind: str, tmp_path: Path, spool_writer: Any) -> None:
    spool = tmp_path / "spool"
    spool_writer(
        spool,
        "s",
        "--first-step",
        "2",
        "--steps",
        "5",
        "--slow-rank",
        "1",
        "--slow-kind",
        kind,
        "--slow-ms",
        "40",
        "--shapes",
        nproc=2,
    )
    storage = LocalStorage(tmp_path / "diag")
    for rank in (0, 1):
        assert process_window(spool, rank, "s", storage).phase == "done"
    victim, culprit = category_beta(storage, 0), category_beta(storage, 1)
    assert victim["communication"] > 0.5 > culprit["communication"], (victim, culprit)
    assert 1 - culprit["communication"] > 2 * (1 - victim["communication"])
    if kind == "aten":
        # The extra matmuls are aten work the profiler sees.
        assert culprit["cpu_op"] > 0.4 > victim["cpu_op"], (victim, culprit)
    else:
        # Without Python stacks, the extra interpreter work is uninstrumented time.
        assert culprit["idle"] > 0.4 > victim["idle"], (victim, culprit)
    events = table_from_bytes(storage.get_bytes("workers/0/events.parquet"))
    gloo = events.filter(pc.equal(events["name"], "gloo:all_reduce"))
    assert gloo.num_rows >= 5
    assert set(gloo["collective"].to_pylist()) == {"allreduce"}
    # DDP all-reduces every gradient in one bucket: 128*256 + 256 + 256*10 + 10 floats (the
    # size comes from the annotation's recorded input shape).
    assert set(gloo["msg_bytes"].to_pylist()) == {(128 * 256 + 256 + 256 * 10 + 10) * 4}
