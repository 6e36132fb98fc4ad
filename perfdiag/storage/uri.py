"""A storage from its URI: a local folder or S3 (the S3 client is imported only for S3)."""

from __future__ import annotations

from pathlib import Path

from perfdiag.storage.base import Storage, StorageError
from perfdiag.storage.local import LocalStorage


def open_storage(uri: str | Path) -> Storage:
    """Open the storage a URI names. `s3://` reads credentials from the standard variables."""
    text = str(uri)
    if text.startswith("s3://"):
        from perfdiag.storage.s3 import S3Storage  # minio: only when S3 is used

        return S3Storage.from_uri(text)
    if text.startswith("file://"):
        text = text[len("file://") :]
    elif "://" in text:
        scheme = text.split("://", 1)[0]
        raise StorageError(
            f"unsupported storage URI {text!r}: scheme {scheme!r} (use a path or s3://)"
        )
    return LocalStorage(Path(text))
