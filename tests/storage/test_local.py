"""LocalStorage specifics: paths, temp files, write failures (the shared contract is in
test_contract.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from perfdiag.storage import open_storage
from perfdiag.storage.base import StorageError
from perfdiag.storage.local import LocalStorage


@pytest.mark.parametrize("form", ["plain", "file"])
def test_open_storage_gives_local_storage(tmp_path: Path, form: str) -> None:
    uri = str(tmp_path) if form == "plain" else f"file://{tmp_path}"
    storage = open_storage(uri)
    assert isinstance(storage, LocalStorage)
    assert storage.root == tmp_path
    assert storage.uri == str(tmp_path)


def test_relative_roots_become_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    storage = LocalStorage(Path("captures/run1"))
    storage.put_bytes("plan.json", b"{}")
    assert storage.root == tmp_path / "captures" / "run1"
    assert (tmp_path / "captures" / "run1" / "plan.json").read_bytes() == b"{}"


def test_unsupported_scheme_is_an_error() -> None:
    with pytest.raises(StorageError, match="unsupported storage URI"):
        open_storage("gs://bucket/prefix")


def test_local_path_points_at_the_file(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    storage.put_bytes("workers/2/status.json", b"{}")
    path = storage.local_path("workers/2/status.json")
    assert path == tmp_path / "workers" / "2" / "status.json"
    assert path is not None and path.read_bytes() == b"{}"


def test_keys_cannot_escape_the_root(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "root")
    for key in ("../outside", "a/../../outside", "/etc/passwd"):
        with pytest.raises(StorageError, match="invalid storage key"):
            storage.put_bytes(key, b"x")
    assert not (tmp_path / "outside").exists()


def test_write_goes_through_a_temp_file_and_a_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The target path only ever appears complete: os.replace is the one step that makes it."""
    storage = LocalStorage(tmp_path)
    storage.put_bytes("verdict.json", b"old")
    renames: list[tuple[str, str, bytes, bytes]] = []
    real_replace = os.replace

    def spying_replace(src: str, dst: str) -> None:
        renames.append((src, dst, Path(src).read_bytes(), Path(dst).read_bytes()))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spying_replace)
    storage.put_bytes("verdict.json", b"new and complete")
    assert len(renames) == 1
    src, dst, src_content, dst_content = renames[0]
    assert Path(dst) == tmp_path / "verdict.json"
    assert Path(src).parent == tmp_path and Path(src).name.startswith(".verdict.json.")
    assert src_content == b"new and complete"  # fully written before the rename
    assert dst_content == b"old"  # readers saw the old version until then
    assert sorted(p.name for p in tmp_path.iterdir()) == ["verdict.json"]


def test_temp_files_are_not_listed(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    storage.put_bytes("workers/0/summary.parquet", b"x")
    (tmp_path / "workers" / "0" / ".summary.parquet.abc.tmp").write_bytes(b"partial")
    assert storage.list() == ["workers/0/summary.parquet"]


def test_unwritable_location_is_a_storage_error(tmp_path: Path) -> None:
    # A regular file where a folder should be: fails for root too (unlike chmod).
    blocker = tmp_path / "blocker"
    blocker.write_text("not a folder")
    storage = LocalStorage(blocker / "captures")
    with pytest.raises(StorageError, match="cannot write"):
        storage.put_bytes("plan.json", b"{}")
    source = tmp_path / "source.bin"
    source.write_bytes(b"data")
    with pytest.raises(StorageError, match="cannot write"):
        storage.put_file("workers/0/events.parquet", source)
    readable = LocalStorage(tmp_path / "readable")
    readable.put_bytes("x", b"1")
    with pytest.raises(StorageError, match="cannot write"):
        readable.get_file("x", blocker / "x")


def test_failed_write_leaves_no_temp_file(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    with pytest.raises(StorageError):
        storage.put_file("workers/0/events.parquet", tmp_path / "missing-source")
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_reading_a_folder_is_a_storage_error(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    storage.put_bytes("workers/0/status.json", b"{}")
    with pytest.raises(StorageError, match="cannot read"):
        storage.get_bytes("workers/0")
