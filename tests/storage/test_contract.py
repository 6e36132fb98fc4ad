"""The Storage contract (perfdiag/storage/base.py), run against every backend."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from perfdiag.storage import layout
from perfdiag.storage.base import Storage, StorageError, StorageNotFound


def test_bytes_round_trip_and_overwrite(storage: Storage) -> None:
    storage.put_bytes("plan.json", b'{"id": "a"}')
    assert storage.get_bytes("plan.json") == b'{"id": "a"}'
    storage.put_bytes("plan.json", b'{"id": "b"}')
    assert storage.get_bytes("plan.json") == b'{"id": "b"}'


def test_text_helpers_use_utf8(storage: Storage) -> None:
    storage.put_text("notes/ünïcode.txt", "rank 3 — slow ✓")
    assert storage.get_text("notes/ünïcode.txt") == "rank 3 — slow ✓"
    assert storage.get_bytes("notes/ünïcode.txt") == "rank 3 — slow ✓".encode()


def test_empty_object(storage: Storage) -> None:
    storage.put_bytes("empty", b"")
    assert storage.exists("empty")
    assert storage.get_bytes("empty") == b""


def test_missing_key_is_not_found(storage: Storage, tmp_path: Path) -> None:
    with pytest.raises(StorageNotFound, match=r"missing\.json"):
        storage.get_bytes("missing.json")
    target = tmp_path / "out" / "missing.json"
    with pytest.raises(StorageNotFound):
        storage.get_file("missing.json", target)
    assert not target.exists()
    assert not list(tmp_path.rglob("*.tmp"))


def test_exists(storage: Storage) -> None:
    assert not storage.exists("workers/0/status.json")
    storage.put_bytes("workers/0/status.json", b"{}")
    assert storage.exists("workers/0/status.json")
    assert not storage.exists("workers/0")  # a folder is not a key


def test_list_is_recursive_sorted_and_prefix_means_folder(storage: Storage) -> None:
    assert storage.list() == []
    keys = [
        layout.worker_key(10, layout.SUMMARY),
        layout.worker_key(1, layout.STATUS),
        layout.worker_key(1, layout.SUMMARY),
        layout.PLAN,
        "workers/1x",
    ]
    for key in keys:
        storage.put_bytes(key, key.encode())
    assert storage.list() == sorted(keys)
    assert storage.list("workers/1") == ["workers/1/status.json", "workers/1/summary.parquet"]
    assert storage.list("workers/1/") == ["workers/1/status.json", "workers/1/summary.parquet"]
    assert storage.list("workers/1/status.json") == ["workers/1/status.json"]
    assert storage.list("workers/2") == []
    assert storage.list("nothing") == []


def test_delete_is_idempotent(storage: Storage) -> None:
    storage.put_bytes("verdict.json", b"{}")
    storage.delete("verdict.json")
    assert not storage.exists("verdict.json")
    storage.delete("verdict.json")
    storage.delete("never/was/here")
    assert storage.list() == []


@pytest.mark.parametrize("key", ["", "/abs", "a//b", "a/../b", "./a", "a/."])
def test_invalid_keys_are_rejected(storage: Storage, key: str) -> None:
    with pytest.raises(StorageError, match="invalid storage key"):
        storage.put_bytes(key, b"x")
    with pytest.raises(StorageError, match="invalid storage key"):
        storage.get_bytes(key)


def test_uri_of_names_the_key_under_the_prefix(storage: Storage) -> None:
    assert storage.uri_of("workers/3/stacks.json") == f"{storage.uri}/workers/3/stacks.json"


def test_file_round_trip(storage: Storage, tmp_path: Path) -> None:
    source = tmp_path / "summary.parquet"
    source.write_bytes(bytes(range(256)) * 1000)
    storage.put_file("workers/0/summary.parquet", source)
    target = tmp_path / "down" / "deeper" / "summary.parquet"
    storage.get_file("workers/0/summary.parquet", target)
    assert target.read_bytes() == source.read_bytes()
    assert [p.name for p in target.parent.iterdir()] == ["summary.parquet"]  # no temp left


def test_get_file_replaces_an_existing_file(storage: Storage, tmp_path: Path) -> None:
    storage.put_bytes("k", b"new")
    target = tmp_path / "k"
    target.write_bytes(b"old content, longer than the new one")
    storage.get_file("k", target)
    assert target.read_bytes() == b"new"


def test_failed_upload_keeps_the_previous_object(storage: Storage, tmp_path: Path) -> None:
    storage.put_bytes("workers/0/events.parquet", b"previous")
    with pytest.raises(StorageError):
        storage.put_file("workers/0/events.parquet", tmp_path / "does-not-exist")
    assert storage.get_bytes("workers/0/events.parquet") == b"previous"
    assert storage.list() == ["workers/0/events.parquet"]


def test_large_file_round_trip(
    storage: Storage,
    large_file: tuple[Path, str],
    tmp_path: Path,
    sha256_file: Callable[[Path], str],
) -> None:
    path, digest = large_file
    storage.put_file("workers/0/events.parquet", path)
    target = tmp_path / "events.parquet"
    storage.get_file("workers/0/events.parquet", target)
    assert target.stat().st_size == path.stat().st_size
    assert sha256_file(target) == digest


def test_readers_never_see_a_partial_object(storage: Storage) -> None:
    """A writer keeps replacing one key with whole versions; every concurrent read returns one
    of them entirely."""
    size = 3 << 20
    versions = [bytes([n]) * size for n in range(1, 4)]
    storage.put_bytes("timeline.json.gz", versions[0])
    stop = threading.Event()
    errors: list[BaseException] = []

    def write() -> None:
        try:
            n = 0
            while not stop.is_set():
                n += 1
                storage.put_bytes("timeline.json.gz", versions[n % len(versions)])
        except BaseException as exc:
            errors.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    reads = 0
    try:
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline or reads < 5:
            data = storage.get_bytes("timeline.json.gz")
            reads += 1
            assert len(data) == size, f"read {len(data)} bytes of a {size}-byte object"
            assert data in versions, "read a mix of two versions"
    finally:
        stop.set()
        writer.join()
    assert not errors
    assert storage.list() == ["timeline.json.gz"]  # no temporary objects or files visible


def test_put_many_writes_each_object_and_returns_each_error(storage: Storage) -> None:
    storage.put_bytes("pods/b.json", b"old")
    items = [
        ("pods/a.json", b'{"id": "a"}'),
        ("pods/b.json", b"new"),
        ("pods//invalid", b"x"),
        ("pods/ü +.json", "✓".encode()),
        ("pods/empty.json", b""),
    ]
    errors = storage.put_many(items)
    assert [error is None for error in errors] == [True, True, False, True, True]
    assert isinstance(errors[2], StorageError)
    assert "invalid storage key" in str(errors[2])
    assert storage.get_many([key for key, _ in items if key != "pods//invalid"]) == [
        b'{"id": "a"}',
        b"new",
        "✓".encode(),
        b"",
    ]
    assert storage.list() == ["pods/a.json", "pods/b.json", "pods/empty.json", "pods/ü +.json"]


def test_put_many_of_many_objects_and_of_none(storage: Storage) -> None:
    items = [(f"pods/{i}.json", f"plan {i};".encode() * (i % 7)) for i in range(300)]
    assert storage.put_many(items) == [None] * len(items)
    assert storage.get_many([key for key, _ in items]) == [data for _, data in items]
    assert storage.put_many([]) == []
    assert len(storage.list()) == len(items)
