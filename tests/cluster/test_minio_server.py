"""The minio_server fixture: credentials, bucket, environment, and stop/start on one port."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from perfdiag.storage.s3 import S3Storage
from perfdiag_testing.minio_server import MinioServer

pytestmark = pytest.mark.cluster


def test_bucket_exists_and_credentials_are_generated(minio_server: MinioServer) -> None:
    assert minio_server.client().bucket_exists(minio_server.bucket)
    assert len(minio_server.secret_key) >= 16
    assert minio_server.endpoint.startswith("127.0.0.1:")


def test_env_holds_the_standard_variables(minio_server: MinioServer) -> None:
    env = minio_server.env()
    assert env["AWS_ACCESS_KEY_ID"] == minio_server.access_key
    assert env["AWS_SECRET_ACCESS_KEY"] == minio_server.secret_key
    assert env["AWS_ENDPOINT_URL"] == f"http://{minio_server.endpoint}"
    assert env["AWS_REGION"]


def test_s3_prefix_is_fresh_and_in_the_bucket(minio_server: MinioServer, s3_prefix: str) -> None:
    assert s3_prefix.startswith(f"s3://{minio_server.bucket}/")
    assert S3Storage.from_uri(s3_prefix, minio_server.env()).list() == []


def test_stop_and_start_keep_port_and_data(minio_server: MinioServer, s3_prefix: str) -> None:
    storage = S3Storage.from_uri(s3_prefix, minio_server.env())
    storage.put_bytes("kept", b"across restarts")
    port = minio_server.port
    minio_server.stop()
    assert not minio_server.running()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"{minio_server.url}/minio/health/live", timeout=2)
    minio_server.start()
    assert minio_server.port == port
    assert storage.get_bytes("kept") == b"across restarts"
