"""Local filesystem storage: the embedded default. Atomic writes by temp file + rename."""

from __future__ import annotations

import builtins
import os
from collections.abc import Collection, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path
from typing import BinaryIO

from perfdiag.storage.base import (
    Storage,
    StorageError,
    StorageNotFound,
    as_write_error,
    check_key,
    write_via_temp,
)
from perfdiag.storage.regular_file import open_regular, read_listed_file, read_regular

COPY_CHUNK = 1 << 20
WRITERS = 16
"""Files put_many writes at once: each write waits for its fsync, which a disk serves side by
side (2,000 files of 800 bytes: 0.90 s one at a time, 0.71 s with 16 on this machine's disk)."""


class LocalStorage(Storage):
    def __init__(self, root: Path) -> None:
        self.root = root.expanduser().absolute()
        self._root = str(self.root)

    @property
    def uri(self) -> str:
        return str(self.root)

    @property
    def read_concurrency(self) -> int:
        # Reading page-cached files is CPU work: threads beyond one per core only contend for the
        # GIL (reading 10,000 worker files on 2 cores: 11.3 s with 16 threads, 5.9 s with 2). The
        # pool is of processes, two per core: a file not in the page cache waits for the disk,
        # and the other process of the core computes meanwhile (1,000,000 workers on 2 cores,
        # 16 GB of files with 24 GB of memory: 303 s of reading with 2 processes, 206 s with 4).
        return 2 * (os.cpu_count() or 1)

    @property
    def reads_are_cpu_work(self) -> bool:
        return True

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def put_bytes(self, key: str, data: bytes) -> None:
        write_via_temp(self._path(key), (data,), fsync=True)

    def put_many(self, items: Sequence[tuple[str, bytes]]) -> builtins.list[StorageError | None]:
        if len(items) <= 1:
            return super().put_many(items)
        with ThreadPoolExecutor(WRITERS, "perfdiag-local-put") as pool:
            return list(pool.map(self._put_or_error, items))

    def get_bytes(self, key: str) -> bytes:
        # A string path, not a Path: reading a million small files, pathlib cost as much as
        # the reading.
        path = os.path.join(self._root, check_key(key))
        try:
            return read_regular(path)
        except FileNotFoundError as exc:
            raise StorageNotFound(f"{path} does not exist") from exc
        except OSError as exc:
            raise StorageError(f"cannot read {path}: {exc.strerror or exc}") from exc

    def put_file(self, key: str, path: Path) -> None:
        target = self._path(key)
        write_via_temp(target, _chunks_of(path, target), fsync=True)

    def get_file(self, key: str, path: Path) -> None:
        source = self._path(key)
        try:
            src = open_regular(source)
        except FileNotFoundError as exc:
            raise StorageNotFound(f"{source} does not exist") from exc
        except OSError as exc:
            raise StorageError(f"cannot read {source}: {exc.strerror or exc}") from exc
        with src:
            write_via_temp(path, _chunks_of(src, path), fsync=True)

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str = "") -> list[str]:
        base = self.root / prefix if prefix else self.root
        if not base.exists():
            return []
        if base.is_file():
            return [prefix]
        # Directory entries only, no stat per file (rglob + is_file did one each: a minute for
        # a 100,000-worker capture on a busy machine); scandir by hand is ~1.6× os.walk.
        keys: list[str] = []
        relative = os.path.relpath(base, self.root).replace(os.sep, "/")
        pending = [(str(base), "" if relative == "." else relative + "/")]
        while pending:
            folder, head = pending.pop()
            with os.scandir(folder) as entries:
                for entry in entries:
                    if entry.name.startswith("."):
                        continue  # temporary files of writes in progress
                    if entry.is_dir(follow_symlinks=False):
                        pending.append((entry.path, head + entry.name + "/"))
                    else:
                        keys.append(head + entry.name)
        return sorted(keys)

    def list_names(self, folder: str) -> builtins.list[str] | None:
        path = os.path.join(self._root, check_key(folder))
        try:
            with os.scandir(path) as entries:
                return sorted(e.name for e in entries if not e.name.startswith("."))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            raise StorageError(f"cannot list {path}: {exc.strerror or exc}") from exc

    def read_folder(
        self, folder: str, wanted: Collection[str]
    ) -> tuple[builtins.list[str], dict[str, bytes | StorageError]]:
        """One folder's files, read relative to the open folder: a capture of a million
        workers walks a million folders, and full paths cost a lookup of each component."""
        path = os.path.join(self._root, check_key(folder.strip("/")))
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
        except (FileNotFoundError, NotADirectoryError):
            return [], {}
        except OSError as exc:
            raise StorageError(f"cannot list {path}: {exc.strerror or exc}") from exc
        try:
            with os.scandir(fd) as entries:
                files = {
                    e.name: e.is_file(follow_symlinks=False)
                    for e in entries
                    if not e.name.startswith(".") and not e.is_dir(follow_symlinks=False)
                }
            read: dict[str, bytes | StorageError] = {}
            for name, regular in files.items():
                if name in wanted:
                    read[name] = self._read_in(fd, os.path.join(path, name), name, regular)
            return sorted(files), read
        finally:
            os.close(fd)

    @staticmethod
    def _read_in(folder_fd: int, path: str, name: str, regular: bool) -> bytes | StorageError:
        try:
            if regular:
                return read_listed_file(name, folder_fd)
            return read_regular(name, dir_fd=folder_fd)
        except FileNotFoundError:
            return StorageNotFound(f"{path} does not exist")
        except OSError as exc:
            return StorageError(f"cannot read {path}: {exc.strerror or exc}")

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def local_path(self, key: str) -> Path | None:
        return self._path(key)


def _chunks_of(source: Path | BinaryIO, target: Path) -> Iterator[bytes]:
    """The bytes of a local file (a path, or a file open for reading), a MiB at a time; failing
    to read it fails the write of `target` (the copy's own error)."""
    with (
        as_write_error(target),
        source.open("rb") if isinstance(source, Path) else nullcontext(source) as src,
    ):
        while chunk := src.read(COPY_CHUNK):
            yield chunk
