"""S3Storage against the real MinIO when things go wrong: rejected credentials, a missing bucket,
an endpoint nobody listens on, and an endpoint that goes away in the middle of an upload."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from perfdiag.storage.base import StorageError, StorageUnavailable
from perfdiag.storage.s3 import S3Storage
from perfdiag_testing.minio_server import MinioServer
from perfdiag_testing.processes import free_port
from perfdiag_testing.tcp_proxy import ThrottledTcpProxy

pytestmark = pytest.mark.cluster

KEY = "workers/0/events.parquet"


@pytest.mark.parametrize(
    ("variable", "code"),
    [
        ("AWS_SECRET_ACCESS_KEY", "SignatureDoesNotMatch"),
        ("AWS_ACCESS_KEY_ID", "InvalidAccessKeyId"),
    ],
)
def test_wrong_credentials_fail_at_once_saying_so(
    minio_server: MinioServer, s3_prefix: str, variable: str, code: str
) -> None:
    env = {**minio_server.env(), variable: "not-the-right-one"}
    storage = S3Storage.from_uri(s3_prefix, env)
    started = time.monotonic()
    with pytest.raises(StorageError) as info:
        storage.put_bytes("plan.json", b"{}")
    assert not isinstance(info.value, StorageUnavailable)
    message = str(info.value)
    assert "rejected the credentials" in message
    assert code in message
    assert "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY" in message
    assert minio_server.url in message
    assert time.monotonic() - started < 5  # permanent: not retried


def test_missing_bucket_is_named(minio_server: MinioServer) -> None:
    storage = S3Storage.from_uri("s3://no-such-bucket-here/run", minio_server.env())
    for operation in (
        lambda: storage.get_bytes("plan.json"),
        lambda: storage.put_bytes("plan.json", b"{}"),
        lambda: storage.list(),
        lambda: storage.exists("plan.json"),
    ):
        with pytest.raises(StorageError, match="bucket 'no-such-bucket-here' does not exist"):
            operation()


def test_unreachable_endpoint_is_unavailable_after_bounded_retries(
    minio_server: MinioServer,
) -> None:
    closed = f"http://127.0.0.1:{free_port()}"  # free: nothing listens there
    env = {**minio_server.env(), "AWS_ENDPOINT_URL": closed, "PERFDIAG_S3_RETRY_SECONDS": "2"}
    storage = S3Storage.from_uri(f"s3://{minio_server.bucket}/x", env)
    started = time.monotonic()
    with pytest.raises(StorageUnavailable) as info:
        storage.get_bytes("plan.json")
    elapsed = time.monotonic() - started
    message = str(info.value)
    assert closed in message
    assert "attempts" in message
    assert "Connection refused" in message
    assert 0.5 < elapsed < 4, elapsed  # it retried, within its budget


class _Upload:
    """put_file of the large file in a background thread, through a throttled proxy so the
    test can stop MinIO once a known share of the bytes went up."""

    def __init__(self, minio: MinioServer, s3_prefix: str, path: Path, retry_s: float) -> None:
        self.proxy = ThrottledTcpProxy("127.0.0.1", minio.port, bytes_per_second=40 << 20)
        env = {
            **minio.env(),
            "AWS_ENDPOINT_URL": self.proxy.url,
            "PERFDIAG_S3_RETRY_SECONDS": str(retry_s),
        }
        self.storage = S3Storage.from_uri(s3_prefix, env)
        self.storage.list()  # the bucket check happens before the outage
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(path,))

    def _run(self, path: Path) -> None:
        try:
            self.storage.put_file(KEY, path)
        except BaseException as exc:
            self.error = exc

    def start_and_wait_for(self, uploaded: int) -> None:
        self.thread.start()
        deadline = time.monotonic() + 30
        while self.proxy.bytes_up < uploaded:
            assert self.thread.is_alive(), f"upload ended early: {self.error!r}"
            assert time.monotonic() < deadline, "upload made no progress"
            time.sleep(0.01)

    def finish(self, timeout: float) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "upload still running"
        self.proxy.close()


def test_upload_survives_an_outage_in_the_middle(
    minio_server: MinioServer,
    s3_prefix: str,
    large_file: tuple[Path, str],
    tmp_path: Path,
    sha256_file: Callable[[Path], str],
) -> None:
    path, digest = large_file
    upload = _Upload(minio_server, s3_prefix, path, retry_s=60)
    upload.start_and_wait_for(uploaded=path.stat().st_size // 3)
    minio_server.stop(kill=True)  # a crash, mid-upload
    time.sleep(1.0)
    assert upload.thread.is_alive(), "the upload should be retrying while MinIO is down"
    minio_server.start()
    upload.finish(timeout=90)
    assert upload.error is None, repr(upload.error)

    direct = S3Storage.from_uri(s3_prefix, minio_server.env())
    target = tmp_path / "back.bin"
    direct.get_file(KEY, target)
    assert sha256_file(target) == digest
    assert direct.list() == [KEY]


def test_upload_gives_up_cleanly_when_the_endpoint_stays_away(
    minio_server: MinioServer, s3_prefix: str, large_file: tuple[Path, str]
) -> None:
    path, _ = large_file
    upload = _Upload(minio_server, s3_prefix, path, retry_s=3)
    upload.start_and_wait_for(uploaded=path.stat().st_size // 3)
    minio_server.stop(kill=True)
    try:
        upload.finish(timeout=30)
    finally:
        minio_server.start()
    assert isinstance(upload.error, StorageUnavailable), repr(upload.error)
    assert upload.proxy.url in str(upload.error)
    # Nothing partial became visible under the key (the multipart upload never completed).
    direct = S3Storage.from_uri(s3_prefix, minio_server.env())
    assert not direct.exists(KEY)
    assert direct.list() == []
