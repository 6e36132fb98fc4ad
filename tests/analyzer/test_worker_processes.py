"""Reading a capture's workers in bulk (analyzer/load/worker_files.py): a large local capture in
child interpreters gives the same WorkerFiles as the thread path, bad files named the same way,
and threads when the children cannot run; a capture listed in pages (S3) is read as it is
listed, with the same result."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from perfdiag.analyzer.errors import NoCaptureError
from perfdiag.analyzer.load import worker_files
from perfdiag.analyzer.load.capture_folder import load_capture
from perfdiag.analyzer.load.listing import WorkerListing, parse_worker_folders, parse_worker_keys
from perfdiag.api.limits import MAX_RANKS
from perfdiag.engine.parquet_io import table_from_bytes, table_to_bytes
from perfdiag.storage import layout
from perfdiag.storage.local import LocalStorage
from tests.analyzer.conftest import SyntheticJob, write_capture


def _capture(storage: LocalStorage) -> WorkerListing:
    table, metas = SyntheticJob(n_ranks=9, seed=3).build()
    write_capture(storage, table, metas, drop=[4])
    # Rank 2: written by a newer engine (an extra column); rank 6: not Parquet at all.
    key = layout.worker_key(2, layout.SUMMARY)
    newer = table_from_bytes(storage.get_bytes(key))
    newer = newer.append_column("later_column", pa.array([1.0] * newer.num_rows))
    storage.put_bytes(key, table_to_bytes(newer))
    storage.put_bytes(layout.worker_key(6, layout.SUMMARY), b"PAR1 not parquet")
    return parse_worker_keys(storage.list(f"{layout.WORKERS}/"), storage.uri_of(layout.WORKERS))


def _read(storage: LocalStorage, listing: WorkerListing) -> worker_files.WorkerFiles:
    return worker_files.read_worker_files(storage, listing, lambda _message: None)


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
            used.append(len(batch.metas.ranks))
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


def test_folders_listed_where_they_are_read_give_the_same_files(
    local_storage: LocalStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    listed = _capture(local_storage)
    by_keys = _read(local_storage, listed)
    folders = local_storage.list_names(layout.WORKERS)
    assert folders is not None
    unlisted = parse_worker_folders(folders, local_storage.uri_of(layout.WORKERS))
    monkeypatch.setattr(worker_files, "PROCESS_MIN_WORKERS", 2)
    monkeypatch.setattr(worker_files, "PROCESS_BATCH_WORKERS", 3)
    monkeypatch.setattr(LocalStorage, "read_concurrency", property(lambda _self: 2))
    by_folders = _read(local_storage, unlisted)
    assert by_folders.summary.equals(by_keys.summary)
    assert by_folders.metas == by_keys.metas
    assert by_folders.statuses == by_keys.statuses
    assert by_folders.unreadable == by_keys.unreadable
    assert by_folders.listing.ranks.tolist() == listed.ranks.tolist()
    assert by_folders.listing.files.tolist() == listed.files.tolist()


class _PagedStorage(LocalStorage):
    """A storage listed as S3 is: every key, a few per page, no folder of one level."""

    PAGE = 4

    def list_names(self, folder: str) -> list[str] | None:
        return None

    def list_pages(self, prefix: str = "") -> Iterator[list[str]]:
        keys = self.list(prefix)
        for start in range(0, len(keys), self.PAGE):
            yield keys[start : start + self.PAGE]


def test_a_capture_listed_in_pages_is_read_as_it_is_listed(
    local_storage: LocalStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    _capture(local_storage)
    # Rank 1's status.json and rank 10's folder above the rank limit: read and noted alike.
    local_storage.put_bytes(layout.worker_key(1, layout.STATUS), b"{not json")
    local_storage.put_bytes(f"{layout.WORKERS}/{MAX_RANKS}/{layout.SUMMARY}", b"x")
    monkeypatch.setattr(worker_files, "BATCH_WORKERS", 3)  # batches made as pages come
    lines: list[str] = []
    whole = load_capture(local_storage)
    paged = load_capture(_PagedStorage(local_storage.root), lines.append)
    assert paged.summary.equals(whole.summary)
    assert paged.metas == whole.metas and paged.statuses == whole.statuses
    assert paged.unreadable == whole.unreadable and paged.notes == whole.notes
    assert any(f"ignored {local_storage.uri_of(layout.WORKERS)}/{MAX_RANKS}/" in n
               for n in paged.notes)  # fmt: skip
    assert paged.hardware_ranks.tolist() == whole.hardware_ranks.tolist()
    assert any(line.startswith("listed ") and "page(s)" in line for line in lines), lines


def test_an_empty_paged_listing_is_no_capture(tmp_path: Path) -> None:
    storage = _PagedStorage(tmp_path / "empty")
    storage.put_text("notes.txt", "no capture here")
    with pytest.raises(NoCaptureError, match="no capture in"):
        load_capture(storage)
