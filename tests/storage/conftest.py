"""The storage backends under test: the same contract runs against LocalStorage and against
S3Storage on the session's real MinIO. Also a large random file, shared by the upload tests."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from perfdiag.storage.base import Storage
from perfdiag.storage.local import LocalStorage
from perfdiag.storage.s3 import S3Storage

# Over the 64 MiB of the issue, and not a multiple of the 16 MiB part size.
LARGE_FILE_SIZE = 70 * (1 << 20) + 12345


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.cluster)])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    if request.param == "local":
        return LocalStorage(tmp_path / "store")
    uri = request.getfixturevalue("s3_prefix")
    env = request.getfixturevalue("minio_server").env()
    return S3Storage.from_uri(uri, env)


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as source:
        while block := source.read(8 << 20):
            digest.update(block)
    return digest.hexdigest()


@pytest.fixture(scope="session")
def sha256_file() -> Callable[[Path], str]:
    return _sha256_file


@pytest.fixture(scope="session")
def large_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """(path, sha256) of a random (incompressible) file over 64 MiB. Read-only for tests."""
    path = tmp_path_factory.mktemp("large") / "large.bin"
    digest = hashlib.sha256()
    with path.open("wb") as out:
        left = LARGE_FILE_SIZE
        while left:
            block = os.urandom(min(8 << 20, left))
            digest.update(block)
            out.write(block)
            left -= len(block)
    return path, digest.hexdigest()
