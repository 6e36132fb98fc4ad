"""Reading a large local capture in child interpreters (analyzer/load/worker_files.py): the same
WorkerFiles as the thread path, bad files named the same way, and threads when the children
cannot run."""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pytest

from perfdiag.analyzer.load import worker_files
from perfdiag.engine.parquet_io import table_from_bytes, table_to_bytes
from perfdiag.storage import layout
from perfdiag.storage.local import LocalStorage
from tests.analyzer.conftest import SyntheticJob, write_capture


def _capture(storage: LocalStorage) -> dict[int, set[str]]:
    table, metas = SyntheticJob(n_ranks=9, seed=3).build()
    write_capture(storage, table, metas, drop=[4])
    # Rank 2: written by a newer engine (an extra column); rank 6: not Parquet at all.
    key = layout.worker_key(2, layout.SUMMARY)
    newer = table_from_bytes(storage.get_bytes(key))
    newer = newer.append_column("later_column", pa.array([1.0] * newer.num_rows))
    storage.put_bytes(key, table_to_bytes(newer))
    storage.put_bytes(layout.worker_key(6, layout.SUMMARY), b"PAR1 not parquet")
    by_rank: dict[int, set[str]] = {}
    for key in storage.list(f"{layout.WORKERS}/"):
        rank = layout.rank_of_worker_key(key)
        assert rank is not None
        by_rank.setdefault(rank, set()).add(key.rsplit("/", 1)[1])
    return by_rank


def _read(storage: LocalStorage, by_rank: dict[int, set[str]]) -> worker_files.WorkerFiles:
    return worker_files.read_worker_files(storage, by_rank, lambda _message: None)


def test_child_interpreters_read_what_threads_read(
    local_storage: LocalStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    by_rank = _capture(local_storage)
    monkeypatch.setattr(worker_files, "PROCESS_MIN_WORKERS", 10**9)
    threads = _read(local_storage, by_rank)
    monkeypatch.setattr(worker_files, "PROCESS_MIN_WORKERS", 2)
    monkeypatch.setattr(worker_files, "PROCESS_BATCH_WORKERS", 2)  # several batches each
    monkeypatch.setattr(LocalStorage, "read_concurrency", property(lambda _self: 2))
    used: list[int] = []
    real = worker_files.map_in_processes

    def counting(*args: object) -> object:
        for batch in real(*args):  # type: ignore[arg-type]
            used.append(len(batch.ranks))
            yield batch

    monkeypatch.setattr(worker_files, "map_in_processes", counting)
    processes = _read(local_storage, by_rank)
    assert sum(used) == 7, "the children read the 7 summaries that are Parquet"
    assert processes.summary.equals(threads.summary)
    assert processes.summary["rank"].to_pylist() == sorted(processes.summary["rank"].to_pylist())
    assert set(processes.metas) == {0, 1, 2, 3, 5, 7, 8}
    assert processes.metas == threads.metas
    assert processes.statuses == threads.statuses
    assert processes.unreadable == threads.unreadable
    assert "not a readable Parquet file" in processes.unreadable[6]


def test_threads_take_over_when_no_child_can_start(
    local_storage: LocalStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    by_rank = _capture(local_storage)
    expected = _read(local_storage, by_rank)
    monkeypatch.setattr(worker_files, "PROCESS_MIN_WORKERS", 2)
    monkeypatch.setattr(LocalStorage, "read_concurrency", property(lambda _self: 2))
    monkeypatch.setattr(sys, "executable", str(Path("/nonexistent/python")))
    got = _read(local_storage, by_rank)
    assert got.summary.equals(expected.summary)
    assert got.metas == expected.metas
