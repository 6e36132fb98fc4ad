"""The storage interface and URI dispatch."""

from __future__ import annotations

import abc
import builtins
import os
import tempfile
from collections.abc import Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path


class StorageError(Exception):
    """A storage operation failed; the message says which URI and why."""


class StorageNotFound(StorageError):
    """The key does not exist."""


class StorageUnavailable(StorageError):
    """The backend could not be reached after retries (outage, wrong endpoint)."""


class Storage(abc.ABC):
    """A flat key space under one prefix. Keys use '/' and never start with it."""

    @property
    @abc.abstractmethod
    def uri(self) -> str:
        """The URI of the prefix, as a user would type it."""

    def uri_of(self, key: str) -> str:
        return f"{self.uri.rstrip('/')}/{key}"

    @abc.abstractmethod
    def put_bytes(self, key: str, data: bytes) -> None:
        """Write atomically: readers see the old object or the whole new one."""

    @abc.abstractmethod
    def get_bytes(self, key: str) -> bytes:
        """Raise StorageNotFound when the key does not exist."""

    @abc.abstractmethod
    def put_file(self, key: str, path: Path) -> None:
        """Upload a local file atomically (large files stream; S3 uses multipart)."""

    @abc.abstractmethod
    def get_file(self, key: str, path: Path) -> None:
        """Download to a local path (written atomically)."""

    @abc.abstractmethod
    def exists(self, key: str) -> bool: ...

    @abc.abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """All keys under `prefix` (recursive), sorted, relative to this storage's root."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove a key; missing keys are fine (idempotent)."""

    def get_text(self, key: str) -> str:
        return self.get_bytes(key).decode("utf-8")

    def put_text(self, key: str, text: str) -> None:
        self.put_bytes(key, text.encode("utf-8"))

    def local_path(self, key: str) -> Path | None:
        """A local file holding the key, when the backend is a filesystem (else None)."""
        return None

    @property
    def read_concurrency(self) -> int:
        """Reads worth having in flight at once when reading many keys: a network store
        hides its latency behind many."""
        return 16

    def get_many(self, keys: Sequence[str]) -> builtins.list[bytes | StorageError]:
        """The bytes of each key, or the StorageError get_bytes raises for it, in order: for
        reading many small objects, which a backend may fetch side by side."""
        out: builtins.list[bytes | StorageError] = []
        for key in keys:
            try:
                out.append(self.get_bytes(key))
            except StorageError as exc:
                out.append(exc)
        return out

    def put_many(self, items: Sequence[tuple[str, bytes]]) -> builtins.list[StorageError | None]:
        """Write each (key, bytes) as put_bytes does; for each, in order, the StorageError
        put_bytes raises for it or None: for writing many small objects, which a backend may
        send side by side."""
        return [self._put_or_error(item) for item in items]

    def _put_or_error(self, item: tuple[str, bytes]) -> StorageError | None:
        """put_bytes of (key, bytes); the StorageError it raises, returned."""
        try:
            self.put_bytes(*item)
        except StorageError as exc:
            return exc
        return None

    def list_pages(self, prefix: str = "") -> Iterator[builtins.list[str]]:
        """The keys of `list(prefix)`, in parts as the backend lists them (S3: a request of
        1,000 keys each), so that a caller can use the first while the next are listed."""
        yield self.list(prefix)

    def list_names(self, folder: str) -> builtins.list[str] | None:
        """The names directly in `folder` (its files and folders, one level), or None when the
        backend cannot list one level cheaply (S3: a request per folder)."""
        return None

    def read_folder(
        self, folder: str, wanted: Collection[str]
    ) -> tuple[builtins.list[str], dict[str, bytes | StorageError]]:
        """The names of the files directly in `folder`, and the bytes (or the StorageError
        get_bytes raises) of those of them that are `wanted`."""
        prefix = folder.strip("/") + "/"
        names = sorted({k[len(prefix) :] for k in self.list(folder) if "/" not in k[len(prefix) :]})
        read = [name for name in names if name in wanted]
        return names, dict(zip(read, self.get_many([prefix + n for n in read]), strict=True))

    @property
    def reads_side_by_side(self) -> bool:
        """Whether get_many fetches `read_concurrency` keys at once by itself (a caller then
        needs no pool of its own to keep them in flight)."""
        return False

    @property
    def reads_are_cpu_work(self) -> bool:
        """Whether reading a key costs CPU rather than waiting (a page-cached local file): then
        many keys are read by `read_concurrency` processes, not threads (the GIL)."""
        return False


def check_key(key: str) -> str:
    if not key or key.startswith("/") or any(part in ("", ".", "..") for part in key.split("/")):
        raise StorageError(f"invalid storage key {key!r}: keys are relative, '/'-separated paths")
    return key


@contextmanager
def as_write_error(target: Path) -> Iterator[None]:
    """An OSError inside becomes the StorageError of a failed write of `target`."""
    try:
        yield
    except OSError as exc:
        raise StorageError(f"cannot write {target}: {exc.strerror or exc}") from exc


def write_via_temp(target: Path, chunks: Iterable[bytes], *, fsync: bool) -> None:
    """Write the chunks to `target` through a temporary file beside it, then rename: readers
    never see a part, and a failure leaves nothing behind. The file's own errors become
    StorageError; an error raised by `chunks` itself propagates as it is (an S3 download's
    broken stream stays an error its retry policy judges)."""
    with as_write_error(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in chunks:
                with as_write_error(target):
                    out.write(chunk)
            with as_write_error(target):
                out.flush()
                if fsync:
                    os.fsync(out.fileno())
                out.close()  # here, so that its error too is the write's
        with as_write_error(target):
            os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
