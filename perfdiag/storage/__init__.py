"""Storage for captures: one interface, local filesystem or S3-compatible (docs/design.md §1, §3).

URIs: `/path`, `relative/path`, `file:///path` or `s3://bucket/prefix`. Keys are relative,
'/'-separated; writes are atomic and idempotent (same key, same bytes → same object).
"""

from perfdiag.storage import layout
from perfdiag.storage.base import (
    Storage,
    StorageError,
    StorageNotFound,
    StorageUnavailable,
)
from perfdiag.storage.uri import open_storage

__all__ = [
    "Storage",
    "StorageError",
    "StorageNotFound",
    "StorageUnavailable",
    "layout",
    "open_storage",
]
