"""A file over 64 MiB goes to MinIO as a multipart upload and comes back byte for byte."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from perfdiag.storage.s3 import PART_SIZE, S3Storage
from perfdiag_testing.minio_server import MinioServer

pytestmark = pytest.mark.cluster


def test_large_file_is_a_completed_multipart_object(
    minio_server: MinioServer, s3_prefix: str, large_file: tuple[Path, str]
) -> None:
    path, digest = large_file
    storage = S3Storage.from_uri(s3_prefix, minio_server.env())
    storage.put_file("workers/7/events.parquet", path)

    # Checked with the plain minio client, not through S3Storage.
    client = minio_server.client()
    name = f"{storage.prefix}/workers/7/events.parquet"
    stat = client.stat_object(minio_server.bucket, name)
    size = path.stat().st_size
    assert stat.size == size
    parts = -(-size // PART_SIZE)
    assert parts >= 5
    # S3 names a multipart object's ETag "<md5 of the part md5s>-<number of parts>".
    assert str(stat.etag).strip('"').endswith(f"-{parts}"), stat.etag

    sha = hashlib.sha256()
    response = client.get_object(minio_server.bucket, name)
    try:
        for chunk in response.stream(1 << 20):
            sha.update(chunk)
    finally:
        response.close()
        response.release_conn()
    assert sha.hexdigest() == digest


def test_small_objects_are_single_puts(minio_server: MinioServer, s3_prefix: str) -> None:
    storage = S3Storage.from_uri(s3_prefix, minio_server.env())
    storage.put_bytes("workers/0/summary.parquet", b"x" * 1000)
    stat = minio_server.client().stat_object(
        minio_server.bucket, f"{storage.prefix}/workers/0/summary.parquet"
    )
    assert "-" not in str(stat.etag)
