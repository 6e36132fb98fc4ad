"""S3Storage configuration from URIs and the standard environment variables (no server)."""

from __future__ import annotations

import pytest

from perfdiag.storage import open_storage
from perfdiag.storage.base import StorageError
from perfdiag.storage.s3 import (
    DEFAULT_ENDPOINT,
    S3Storage,
    credentials_from_env,
    endpoint_from_env,
    parse_s3_uri,
)

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "key", "AWS_SECRET_ACCESS_KEY": "secret"}


@pytest.mark.parametrize(
    ("uri", "bucket", "prefix"),
    [
        ("s3://bucket", "bucket", ""),
        ("s3://bucket/", "bucket", ""),
        ("s3://bucket/runs/42", "bucket", "runs/42"),
        ("s3://bucket/runs/42/", "bucket", "runs/42"),
    ],
)
def test_uri_parsing(uri: str, bucket: str, prefix: str) -> None:
    assert parse_s3_uri(uri) == (bucket, prefix)
    storage = S3Storage.from_uri(uri, {**CREDENTIALS, "AWS_ENDPOINT_URL": "http://127.0.0.1:9"})
    assert (storage.bucket, storage.prefix) == (bucket, prefix)
    assert storage.uri == (f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}")


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("s3://", "names no bucket"),
        ("s3:///prefix", "names no bucket"),
        ("s3://ab/x", "invalid bucket name"),
        ("s3://my..bucket/x", "invalid successive characters"),
        ("s3://bucket/a/../b", "plain '/'-separated path"),
        ("http://bucket/x", "not an S3 URI"),
    ],
)
def test_bad_uris_are_rejected(uri: str, message: str) -> None:
    with pytest.raises(StorageError, match=message):
        parse_s3_uri(uri)


def test_endpoint_variables_in_order_of_precedence() -> None:
    assert endpoint_from_env({}) == DEFAULT_ENDPOINT
    assert endpoint_from_env({"S3_ENDPOINT": "http://c:3"}) == "http://c:3"
    assert endpoint_from_env({"S3_ENDPOINT": "c:3"}) == "https://c:3"
    env = {"AWS_ENDPOINT_URL": "http://b:2", "S3_ENDPOINT": "http://c:3"}
    assert endpoint_from_env(env) == "http://b:2"
    env["AWS_ENDPOINT_URL_S3"] = "https://a:1"
    assert endpoint_from_env(env) == "https://a:1"


def test_scheme_decides_tls() -> None:
    plain = S3Storage.from_uri("s3://bkt", {**CREDENTIALS, "AWS_ENDPOINT_URL": "http://h:9000"})
    secure = S3Storage.from_uri("s3://bkt", {**CREDENTIALS, "AWS_ENDPOINT_URL": "https://h:9443/"})
    assert plain.endpoint_url == "http://h:9000"
    assert secure.endpoint_url == "https://h:9443"
    assert not plain.client._base_url.is_https
    assert secure.client._base_url.is_https


@pytest.mark.parametrize("endpoint", ["ftp://h", "http://", "http://h:1/some/path"])
def test_bad_endpoints_are_rejected(endpoint: str) -> None:
    with pytest.raises(StorageError, match="endpoint"):
        S3Storage.from_uri("s3://bkt", {**CREDENTIALS, "AWS_ENDPOINT_URL": endpoint})


def test_credentials_from_env() -> None:
    creds = credentials_from_env({**CREDENTIALS, "AWS_SESSION_TOKEN": "tok"})
    assert (creds.access_key, creds.secret_key, creds.session_token) == ("key", "secret", "tok")
    assert "AWS_SESSION_TOKEN" in creds.source
    anonymous = credentials_from_env({})
    assert anonymous.access_key is None
    assert "not set" in anonymous.source
    with pytest.raises(StorageError, match="AWS_SECRET_ACCESS_KEY is not set"):
        credentials_from_env({"AWS_ACCESS_KEY_ID": "key"})
    with pytest.raises(StorageError, match="AWS_ACCESS_KEY_ID is not set"):
        credentials_from_env({"AWS_SECRET_ACCESS_KEY": "secret"})


def test_retry_budget_from_env() -> None:
    env = {**CREDENTIALS, "AWS_ENDPOINT_URL": "http://h:1", "PERFDIAG_S3_RETRY_SECONDS": "7.5"}
    assert S3Storage.from_uri("s3://bkt", env).retry.max_elapsed_s == 7.5
    with pytest.raises(StorageError, match="PERFDIAG_S3_RETRY_SECONDS"):
        S3Storage.from_uri("s3://bkt", {**env, "PERFDIAG_S3_RETRY_SECONDS": "soon"})


def test_open_storage_dispatches_s3_uris(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    storage = open_storage("s3://bucket/prefix")
    assert isinstance(storage, S3Storage)
    assert storage.uri == "s3://bucket/prefix"
    assert storage.endpoint_url == "http://127.0.0.1:9"
