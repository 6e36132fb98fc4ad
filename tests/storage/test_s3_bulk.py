"""Reading and writing many small objects of S3 (perfdiag/storage/s3_bulk.py): requests signed
as the minio client signs them, one GET or PUT per object and one listing request per 1,000 keys,
and every answer that is not a plain 200 (or, to a GET, a plain NoSuchKey) asked again through
the minio client (its retries and errors)."""

from __future__ import annotations

import datetime
import hashlib
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from minio.credentials import Credentials
from minio.signer import sign_v4_s3

from perfdiag.analyzer import analyze
from perfdiag.storage import StorageError, StorageNotFound, layout
from perfdiag.storage.s3 import S3Storage
from perfdiag.storage.s3_bulk import (
    EMPTY_SHA256,
    BulkClient,
    Endpoint,
    Keys,
    NotPlain,
    _parse_head,
    _Signer,
)
from perfdiag_testing.minio_server import MinioServer
from tests.analyzer.conftest import Fault, SyntheticJob, write_capture

NOW = datetime.datetime(2026, 11, 27, 12, 34, 56, tzinfo=datetime.timezone.utc)


@pytest.mark.parametrize("token", [None, "a-session-token"])
@pytest.mark.parametrize("method", ["GET", "PUT"])
def test_requests_are_signed_as_the_minio_client_signs_them(method: str, token: str | None) -> None:
    endpoint = Endpoint("http", "127.0.0.1:9000", "/bucket/", "/bucket", "us-east-1")
    signer = _Signer(endpoint, Keys("AKID", "secret/key", token))
    path = "/bucket/prefix/workers/12/summary.parquet"
    body_sha256 = EMPTY_SHA256 if method == "GET" else hashlib.sha256(b"a plan").hexdigest()
    signed = signer.headers(path, "", NOW.timestamp(), method, body_sha256)
    ours = dict(line.split(": ", 1) for line in signed.split("\r\n"))
    headers: dict[str, Any] = {
        "Host": endpoint.host,
        "x-amz-content-sha256": body_sha256,
        "x-amz-date": NOW.strftime("%Y%m%dT%H%M%SZ"),
    }
    if token:
        headers["X-Amz-Security-Token"] = token
    theirs = sign_v4_s3(
        method=method,
        url=urlsplit(f"http://127.0.0.1:9000{path}"),
        region="us-east-1",
        headers=headers,
        credentials=Credentials("AKID", "secret/key", token),
        content_sha256=body_sha256,
        date=NOW,
    )
    assert ours["Authorization"] == theirs["Authorization"]


def test_only_a_plain_answer_is_taken() -> None:
    assert _parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\nETag: x") == (200, 12, False)
    assert _parse_head(b"HTTP/1.1 404 Not Found\r\ncontent-length: 3") == (404, 3, False)
    assert _parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nConnection: close")[2]
    for head in (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked",
        b"HTTP/1.1 200 OK",
        b"SSH-2.0-OpenSSH",
    ):
        with pytest.raises(NotPlain):
            _parse_head(head)


def _counting(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts of lean GETs and PUTs of objects, lean listing pages, and minio-client reads and
    writes."""
    counts = {"get": 0, "put": 0, "page": 0, "client_get": 0, "client_put": 0}

    def wrap(owner: Any, name: str, counter: str) -> None:
        real: Callable[..., Any] = getattr(owner, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            # get_all and put_all send one request per object, pipelined on one connection.
            counts[counter] += len(args[1]) if name.endswith("_all") else 1
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, counted)

    wrap(BulkClient, "get", "get")
    wrap(BulkClient, "get_all", "get")
    wrap(BulkClient, "put_all", "put")
    wrap(BulkClient, "get_bucket", "page")
    wrap(S3Storage, "get_bytes", "client_get")
    wrap(S3Storage, "put_bytes", "client_put")
    return counts


@pytest.mark.cluster
def test_many_objects_read_in_one_request_each(
    minio_server: MinioServer, s3_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = S3Storage.from_uri(s3_prefix, minio_server.env())
    keys = [f"many/{i}/object.bin" for i in range(1500)]
    for i, key in enumerate(keys[:40]):
        storage.put_bytes(key, bytes([i % 256]) * (i * 997 % 5000))
    with pytest.raises(StorageNotFound) as by_client:
        storage.get_bytes("many/absent")
    counts = _counting(monkeypatch)
    # The absent key's answer (a 404 NoSuchKey) comes among the others' on its connection.
    got = storage.get_many([*keys[:20], "many/absent", *keys[20:40]])
    absent = got.pop(20)
    assert isinstance(absent, StorageNotFound)
    assert str(absent) == str(by_client.value)  # named as the client names it
    assert got == [bytes([i % 256]) * (i * 997 % 5000) for i in range(40)]
    assert counts == {"get": 41, "put": 0, "page": 0, "client_get": 0, "client_put": 0}


@pytest.mark.cluster
def test_a_listing_takes_a_request_per_thousand_keys(
    minio_server: MinioServer, s3_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = S3Storage.from_uri(s3_prefix, minio_server.env())
    names = [f"folder/{i}/{name}" for i in range(520) for name in ("a.json", "b ü+.json")]
    for name in names[:2]:
        storage.put_bytes(name, b"x")
    # Listing thousands of keys needs thousands of objects: the rest written in bulk.
    client = storage.client
    for name in names[2:]:
        client.put_object(storage.bucket, f"{storage.prefix}/{name}", _Empty(), 0)
    storage.put_bytes("folderx/not-under-folder", b"x")
    counts = _counting(monkeypatch)
    assert storage.list("folder") == sorted(names)
    assert counts["page"] == math.ceil(len(names) / 1000)
    assert counts["client_get"] == 0


class _Empty:
    def read(self, _size: int = -1) -> bytes:
        return b""


@pytest.mark.cluster
def test_a_capture_is_read_with_bounded_requests(
    minio_server: MinioServer, s3_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = 600
    table, metas = SyntheticJob(
        n_ranks=n, seed=2, faults=[Fault([400], "train.py(57): tokenize", "python", 40.0)]
    ).build()
    storage = S3Storage.from_uri(s3_prefix, minio_server.env())
    write_capture(storage, table, metas)
    counts = _counting(monkeypatch)
    for name, value in minio_server.env().items():
        monkeypatch.setenv(name, value)
    verdict = analyze(s3_prefix)
    assert verdict.findings[0].ranks == [400]
    assert len(verdict.workers) == n
    # One GET per worker file, one listing page per 1,000 keys; nothing asked twice.
    assert counts["get"] == 2 * n
    assert counts["page"] == math.ceil(2 * n / 1000)
    # The client reads plan.json and trigger.json (absent); no raw events were listed, so
    # none are asked for.
    assert counts["client_get"] == 2
    assert storage.exists(layout.VERDICT)


@pytest.mark.cluster
def test_many_objects_written_in_one_request_each(
    minio_server: MinioServer, s3_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = S3Storage.from_uri(s3_prefix, minio_server.env())
    items = [(f"pod-plans/{i}.json", f"plan {i};".encode() * (i % 50)) for i in range(2000)]
    storage.put_bytes("pod-plans/by-client.json", b"x")
    counts = _counting(monkeypatch)
    assert storage.put_many(items) == [None] * len(items)
    assert counts == {"get": 0, "put": 2000, "page": 0, "client_get": 0, "client_put": 0}
    assert storage.get_many([key for key, _ in items]) == [data for _, data in items]
    # Stored as the minio client stores an object.
    client, names = storage.client, [f"{storage.prefix}/pod-plans/{n}" for n in ("0", "by-client")]
    stats = [client.stat_object(storage.bucket, f"{name}.json") for name in names]
    assert stats[0].content_type == stats[1].content_type == "application/octet-stream"


@pytest.mark.cluster
def test_a_put_answered_otherwise_than_plainly_is_written_by_the_client(
    minio_server: MinioServer, s3_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = S3Storage.from_uri(s3_prefix, minio_server.env())
    items = [(f"pod-plans/{i}.json", f"plan {i}".encode()) for i in range(40)]
    items[13] = ("pod-plans/13-rejected.json", b"plan 13")
    real = _Signer.headers

    def signed_wrongly_for_one(self: _Signer, path: str, *args: Any) -> str:
        # The body's hash signed for an empty body: MinIO answers 400 XAmzContentSHA256Mismatch.
        if path.endswith("13-rejected.json"):
            return real(self, path, "", NOW.timestamp(), "PUT", EMPTY_SHA256)
        return real(self, path, *args)

    monkeypatch.setattr(_Signer, "headers", signed_wrongly_for_one)
    counts = _counting(monkeypatch)
    assert storage.put_many(items) == [None] * len(items)
    assert counts["put"] == len(items)
    # The rejected one, and those after it on its connection should the server close it.
    assert 1 <= counts["client_put"] <= 8
    assert storage.get_many([key for key, _ in items]) == [data for _, data in items]


@pytest.mark.cluster
def test_put_many_of_objects_over_the_pipelined_size_goes_through_the_client(
    minio_server: MinioServer, s3_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("perfdiag.storage.s3.PIPELINED_PUT_MAX_BYTES", 100)
    storage = S3Storage.from_uri(s3_prefix, minio_server.env())
    items = [("small.json", b"s" * 100), ("large.json", b"l" * 101)]
    counts = _counting(monkeypatch)
    assert storage.put_many(items) == [None, None]
    assert (counts["put"], counts["client_put"]) == (1, 1)
    assert storage.get_many(["small.json", "large.json"]) == [b"s" * 100, b"l" * 101]


@pytest.mark.cluster
def test_put_many_into_a_missing_bucket_fails_each_object_as_the_client_does(
    minio_server: MinioServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = S3Storage.from_uri("s3://perfdiag-no-such-bucket/p", minio_server.env())
    with pytest.raises(StorageError) as by_client:
        storage.put_bytes("a.json", b"x")
    storage = S3Storage.from_uri("s3://perfdiag-no-such-bucket/p", minio_server.env())
    counts = _counting(monkeypatch)
    assert storage.put_many([]) == []
    errors = storage.put_many([("a.json", b"x"), ("b.json", b"y")])
    assert [str(error) for error in errors] == [str(by_client.value)] * 2
    assert "does not exist" in str(by_client.value)
    assert counts == {"get": 0, "put": 0, "page": 0, "client_get": 0, "client_put": 0}
