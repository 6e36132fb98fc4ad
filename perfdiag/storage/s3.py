"""S3-compatible storage through the minio client, with the semantics of LocalStorage.

- Atomic objects: a single PUT, or a multipart upload that becomes visible only when completed
  (a failed one is aborted; readers never see part of an object).
- Transient failures (connection refused/reset, timeouts, 5xx, SlowDown) are retried with
  exponential backoff and jitter for a bounded time (perfdiag.storage.retry, the policy the
  collector agent follows too), then raise StorageUnavailable naming the endpoint. The minio
  client's own urllib3 retries are off and its timeouts short, so an outage surfaces within
  that policy instead of urllib3's five-minute defaults.
- Permanent failures (credentials rejected, bucket missing, access denied) raise StorageError at
  once with a message saying what to fix.

Configuration comes from the standard variables: endpoint AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL
or S3_ENDPOINT (http:// or https:// decides TLS); AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and
AWS_SESSION_TOKEN; AWS_REGION or AWS_DEFAULT_REGION; AWS_CA_BUNDLE or SSL_CERT_FILE for TLS.
PERFDIAG_S3_RETRY_SECONDS bounds the retrying of one operation, counted from its first failure
(default 60).
"""

from __future__ import annotations

import builtins
import io
import os
import ssl
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar
from urllib.parse import urlsplit

import certifi
import urllib3
from minio import Minio
from minio.error import InvalidResponseError, S3Error, ServerError
from minio.helpers import check_bucket_name

from perfdiag.storage.base import (
    Storage,
    StorageError,
    StorageNotFound,
    StorageUnavailable,
    check_key,
    write_via_temp,
)
from perfdiag.storage.retry import RetryPolicy
from perfdiag.storage.s3_bulk import BulkClient, Endpoint, Keys, NotPlain, list_pages

ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "S3_ENDPOINT")
REGION_VARIABLES = ("AWS_REGION", "AWS_DEFAULT_REGION")
RETRY_SECONDS_VARIABLE = "PERFDIAG_S3_RETRY_SECONDS"
DEFAULT_ENDPOINT = "https://s3.amazonaws.com"

# Socket timeouts, which turn a silent server into a (transient) failure: per connection, and per
# socket read (a healthy server answers a part upload well within it).
CONNECT_TIMEOUT_S = 3.0
READ_TIMEOUT_S = 60.0

# Objects up to one part go up in a single PUT; larger ones as multipart in parts of this size.
READ_CONCURRENCY = 16
"""Connections reading many keys at once (a capture's workers' files)."""
WRITE_CONCURRENCY = 32
"""Connections writing many keys at once (the pods' plans). A server answers one connection's
requests in turn, so at a PUT latency L they write at most WRITE_CONCURRENCY / L objects a second
(30 ms: ~1,000/s, as many as the 32 one-request writers before them); MinIO on loopback (~1 ms)
is bounded by its own CPU instead, ~1,200 PUTs/s on 2 cores with 16, 32 or 64."""
PIPELINED = 8
"""GETs or PUTs sent at once on one connection (the answers, a few KB to a GET and a few hundred
bytes to a PUT, fit the socket buffers: the server never waits for the client to read while the
client waits to send)."""
PIPELINED_PUT_MAX_BYTES = 1 << 20
"""Objects of put_many up to this size go up pipelined; larger ones one by one by put_bytes."""
PART_SIZE = 16 << 20
PARALLEL_PARTS = 2
_CHUNK = 1 << 20

_CREDENTIAL_CODES = frozenset(
    {
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "InvalidToken",
        "ExpiredToken",
        "InvalidClientTokenId",
        "TokenRefreshRequired",
    }
)
_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "ServiceUnavailable",
        "InternalError",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "XMinioServerNotInitialized",
        "XMinioReadQuorum",
        "XMinioWriteQuorum",
    }
)

T = TypeVar("T")


@dataclass(frozen=True)
class S3Credentials:
    access_key: str | None
    secret_key: str | None
    session_token: str | None = None
    source: str = "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """`s3://bucket/some/prefix/` → ("bucket", "some/prefix")."""
    if not uri.startswith("s3://"):
        raise StorageError(f"not an S3 URI: {uri!r} (expected s3://bucket/prefix)")
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    if not bucket:
        raise StorageError(f"S3 URI {uri!r} names no bucket (expected s3://bucket/prefix)")
    try:
        check_bucket_name(bucket)
    except ValueError as exc:
        raise StorageError(f"S3 URI {uri!r}: {exc}") from exc
    prefix = prefix.strip("/")
    if prefix and any(part in ("", ".", "..") for part in prefix.split("/")):
        raise StorageError(f"S3 URI {uri!r}: the prefix must be a plain '/'-separated path")
    return bucket, prefix


def endpoint_from_env(environ: Mapping[str, str]) -> str:
    for name in ENDPOINT_VARIABLES:
        value = environ.get(name, "").strip()
        if value:
            return value if "://" in value else f"https://{value}"
    return DEFAULT_ENDPOINT


def credentials_from_env(environ: Mapping[str, str]) -> S3Credentials:
    access_key = environ.get("AWS_ACCESS_KEY_ID") or None
    secret_key = environ.get("AWS_SECRET_ACCESS_KEY") or None
    if (access_key is None) != (secret_key is None):
        missing = "AWS_SECRET_ACCESS_KEY" if secret_key is None else "AWS_ACCESS_KEY_ID"
        raise StorageError(f"S3 credentials are incomplete: {missing} is not set")
    token = environ.get("AWS_SESSION_TOKEN") or None
    source = "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY" + (" / AWS_SESSION_TOKEN" if token else "")
    if access_key is None:
        source = "none (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set)"
    return S3Credentials(access_key, secret_key, token, source)


class S3Storage(Storage):
    """Keys live under `s3://<bucket>/<prefix>/` on one S3-compatible endpoint."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str,
        credentials: S3Credentials,
        region: str | None = None,
        retry: RetryPolicy | None = None,
        part_size: int = PART_SIZE,
        ca_file: str | None = None,
    ) -> None:
        self.bucket, self.prefix = parse_s3_uri(f"s3://{bucket}/{prefix}")
        parts = urlsplit(endpoint_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise StorageError(
                f"S3 endpoint {endpoint_url!r} is not an http:// or https:// URL "
                f"(set by {' / '.join(ENDPOINT_VARIABLES)})"
            )
        if parts.path.strip("/") or parts.query:
            raise StorageError(f"S3 endpoint {endpoint_url!r} must not have a path")
        self.endpoint_url = f"{parts.scheme}://{parts.netloc}"
        self.credentials = credentials
        self.retry = retry or RetryPolicy()
        self.part_size = part_size
        http = urllib3.PoolManager(
            timeout=urllib3.Timeout(connect=CONNECT_TIMEOUT_S, read=READ_TIMEOUT_S),
            retries=False,  # retrying is ours (see _call)
            maxsize=8,
            cert_reqs="CERT_REQUIRED",
            ca_certs=ca_file or certifi.where(),
        )
        self.client = Minio(
            parts.netloc,
            access_key=credentials.access_key,
            secret_key=credentials.secret_key,
            session_token=credentials.session_token,
            secure=parts.scheme == "https",
            region=region,
            http_client=http,
        )
        self._bucket_checked = threading.Event()
        self._ca_file = ca_file
        self._bulk: BulkClient | None = None
        self._bulk_made = False
        self._bulk_lock = threading.Lock()
        self._pools: dict[str, ThreadPoolExecutor] = {}

    @classmethod
    def from_uri(cls, uri: str, environ: Mapping[str, str] | None = None) -> S3Storage:
        """`s3://bucket/prefix` configured from the standard environment variables."""
        env = os.environ if environ is None else environ
        bucket, prefix = parse_s3_uri(uri)
        region = next((env[name] for name in REGION_VARIABLES if env.get(name)), None)
        retry = RetryPolicy()
        if env.get(RETRY_SECONDS_VARIABLE):
            try:
                retry = RetryPolicy(max_elapsed_s=float(env[RETRY_SECONDS_VARIABLE]))
            except ValueError as exc:
                raise StorageError(
                    f"{RETRY_SECONDS_VARIABLE}={env[RETRY_SECONDS_VARIABLE]!r} is not a number"
                ) from exc
        return cls(
            bucket,
            prefix,
            endpoint_url=endpoint_from_env(env),
            credentials=credentials_from_env(env),
            region=region,
            retry=retry,
            ca_file=env.get("AWS_CA_BUNDLE") or env.get("SSL_CERT_FILE") or None,
        )

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def _name(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    # -- operations ---------------------------------------------------------------------------

    def put_bytes(self, key: str, data: bytes) -> None:
        name = self._name(key)
        self._call(
            "write",
            self.uri_of(key),
            lambda: self.client.put_object(
                self.bucket,
                name,
                io.BytesIO(data),
                len(data),
                part_size=self.part_size,
                num_parallel_uploads=PARALLEL_PARTS,
            ),
        )

    def get_bytes(self, key: str) -> bytes:
        name = self._name(key)

        def read() -> bytes:
            response = self.client.get_object(self.bucket, name)
            try:
                data: bytes = response.read()
                return data
            finally:
                response.close()
                response.release_conn()

        return self._call("read", self.uri_of(key), read)

    @property
    def read_concurrency(self) -> int:
        return READ_CONCURRENCY

    @property
    def reads_side_by_side(self) -> bool:
        return True

    def get_many(self, keys: Sequence[str]) -> builtins.list[bytes | StorageError]:
        """Plain GETs on READ_CONCURRENCY kept-alive connections, PIPELINED at a time on each
        (perfdiag/storage/s3_bulk.py); a key whose answer is anything but a plain 200 or a
        plain NoSuchKey is read again by get_bytes, whose retries and errors apply."""
        self._check_bucket()
        client = self._bulk_client()
        names = [self._name(key) for key in keys]

        def chunk(indexes: range) -> builtins.list[bytes | StorageError]:
            got = client.get_all([names[i] for i in indexes]) if client is not None else []
            out: builtins.list[bytes | StorageError] = []
            for n, i in enumerate(indexes):
                answer = got[n] if n < len(got) else None
                if answer is not None and answer.status == 200:
                    out.append(answer.body)
                elif answer is not None and answer.no_such_key:
                    out.append(self._not_found(keys[i]))
                else:  # not a plain answer: the client's retries and errors apply
                    try:
                        out.append(self.get_bytes(keys[i]))
                    except StorageError as exc:
                        out.append(exc)
            return out

        return self._in_chunks("get", len(keys), chunk)

    def put_many(self, items: Sequence[tuple[str, bytes]]) -> builtins.list[StorageError | None]:
        """Plain PUTs on WRITE_CONCURRENCY kept-alive connections, PIPELINED at a time on each
        (perfdiag/storage/s3_bulk.py); an object whose answer is anything but a plain 200, or
        over PIPELINED_PUT_MAX_BYTES, is written by put_bytes, whose retries and errors
        apply. A bucket that cannot be opened is every object's error, found once."""
        if not items:
            return []
        try:
            self._check_bucket()
        except StorageError as exc:
            return [exc] * len(items)
        client = self._bulk_client()
        names = [self._lean_put_name(key, data) for key, data in items]

        def chunk(indexes: range) -> builtins.list[StorageError | None]:
            lean = [(i, name) for i in indexes if (name := names[i]) is not None]
            plain: set[int] = set()
            if client is not None and lean:
                got = client.put_all([(name, items[i][1]) for i, name in lean])
                plain = {i for (i, _), a in zip(lean, got, strict=True) if a and a.status == 200}
            return [None if i in plain else self._put_or_error(items[i]) for i in indexes]

        return self._in_chunks("put", len(items), chunk)

    def _lean_put_name(self, key: str, data: bytes) -> str | None:
        """The object name of a put_many item that goes up pipelined; None for one that
        put_bytes writes (or refuses: an invalid key)."""
        try:
            return self._name(key) if len(data) <= PIPELINED_PUT_MAX_BYTES else None
        except StorageError:
            return None

    def _in_chunks(
        self, method: Literal["get", "put"], count: int, chunk: Callable[[range], builtins.list[T]]
    ) -> builtins.list[T]:
        """`chunk` of every PIPELINED consecutive indexes below `count`, READ_CONCURRENCY
        (get) or WRITE_CONCURRENCY (put) chunks at a time, each on its thread's connection;
        joined in order."""
        chunks = [range(i, min(i + PIPELINED, count)) for i in range(0, count, PIPELINED)]
        return [item for part in self._bulk_pool(method).map(chunk, chunks) for item in part]

    def _bulk_pool(self, method: Literal["get", "put"]) -> ThreadPoolExecutor:
        with self._bulk_lock:
            if method not in self._pools:
                size = READ_CONCURRENCY if method == "get" else WRITE_CONCURRENCY
                self._pools[method] = ThreadPoolExecutor(size, f"perfdiag-s3-{method}")
            return self._pools[method]

    def _bulk_client(self) -> BulkClient | None:
        """The lean reader and writer of this bucket, made once from the minio client's own URL
        of an object (path- or virtual-host style, region); None when it cannot be made."""
        with self._bulk_lock:
            if not self._bulk_made:
                self._bulk = self._make_bulk_client()
                self._bulk_made = True
            return self._bulk

    def _make_bulk_client(self) -> BulkClient | None:
        try:
            region = self.client._get_region(self.bucket)
            url = self.client._base_url.build(
                method="GET", region=region, bucket_name=self.bucket, object_name="x"
            )
        except Exception:  # the client's internals moved: get_bytes reads every key
            return None
        if not url.path.endswith("/x"):
            return None
        try:
            bucket = self.client._base_url.build(
                method="GET", region=region, bucket_name=self.bucket
            )
        except Exception:
            return None
        tls = None
        if url.scheme == "https":
            tls = ssl.create_default_context(cafile=self._ca_file or certifi.where())
        endpoint = Endpoint(
            url.scheme, url.netloc, url.path[:-1], bucket.path or "/", region, tls, READ_TIMEOUT_S
        )
        keys = Keys(
            self.credentials.access_key,
            self.credentials.secret_key,
            self.credentials.session_token,
        )
        return BulkClient(endpoint, keys)

    def put_file(self, key: str, path: Path) -> None:
        name = self._name(key)
        try:
            size = path.stat().st_size
        except OSError as exc:
            raise StorageError(f"cannot read {path}: {exc.strerror or exc}") from exc

        def upload() -> None:
            # Reopened on every attempt: a retry restarts the upload from the first byte.
            with path.open("rb") as source:
                self.client.put_object(
                    self.bucket,
                    name,
                    source,
                    size,
                    part_size=self.part_size,
                    num_parallel_uploads=PARALLEL_PARTS,
                )

        self._call("upload", self.uri_of(key), upload)

    def get_file(self, key: str, path: Path) -> None:
        name = self._name(key)

        def download() -> None:
            response = self.client.get_object(self.bucket, name)
            try:
                # An error of the stream propagates as it is, for the retry policy to judge.
                write_via_temp(path, response.stream(_CHUNK), fsync=False)
            finally:
                response.close()
                response.release_conn()

        self._call("download", self.uri_of(key), download)

    def exists(self, key: str) -> bool:
        name = self._name(key)

        def stat() -> bool:
            try:
                self.client.stat_object(self.bucket, name)
            except S3Error as exc:
                if exc.code == "NoSuchKey":
                    return False
                raise
            return True

        return self._call("check", self.uri_of(key), stat)

    def list(self, prefix: str = "") -> list[str]:
        # Same meaning as LocalStorage: `prefix` names a key or a folder, never a partial name.
        return sorted(key for page in self.list_pages(prefix) for key in page)

    def list_pages(self, prefix: str = "") -> Iterator[builtins.list[str]]:
        """The keys of `list`, a page (≤ 1,000 keys, sorted) at a time as S3 lists them, by
        plain ListObjectsV2 requests whose keys are picked out of the XML (the minio client
        spends ~45 µs on each key: 9 s of CPU for a capture of 100,000 workers). Should a page
        not be plain, the minio client lists the rest, with its retries and errors. Listing in
        ranges side by side was tried: MinIO served 110 ranges of one folder 5× slower than the
        folder at once."""
        wanted = prefix.strip("/")
        root = f"{self.prefix}/" if self.prefix else ""
        search = f"{root}{wanted}" if wanted else root

        def keep(names: Iterable[str]) -> builtins.list[str]:
            keys = []
            for name in names:
                key = name[len(root) :]
                if not wanted or key == wanted or key.startswith(f"{wanted}/"):
                    keys.append(key)
            return keys

        self._check_bucket()
        after: str | None = None  # the last name listed
        client = self._bulk_client()
        if client is not None:
            try:
                for page in list_pages(client, search):
                    yield keep(page)
                    after = page[-1] if page else after
                return
            except (NotPlain, OSError):
                pass

        def list_rest() -> builtins.list[str]:
            found = self.client.list_objects(
                self.bucket, prefix=search or None, recursive=True, start_after=after
            )
            return keep(str(obj.object_name) for obj in found)

        yield sorted(self._call("list", self.uri_of(wanted) if wanted else self.uri, list_rest))

    def delete(self, key: str) -> None:
        name = self._name(key)
        # S3 DELETE of a missing key succeeds: idempotent like LocalStorage.delete.
        self._call("delete", self.uri_of(key), lambda: self.client.remove_object(self.bucket, name))

    # -- errors and retries -------------------------------------------------------------------

    def _check_bucket(self) -> None:
        """Once per instance: a listing request, whose XML error tells a missing bucket from
        rejected credentials (HEAD requests carry no error body and cannot)."""
        if self._bucket_checked.is_set():
            return

        def first_key() -> None:
            try:
                next(iter(self.client.list_objects(self.bucket, prefix=self.prefix or None)), None)
            except S3Error as exc:
                if exc.code != "AccessDenied":  # may write without the right to list: fine
                    raise

        self._call("open", self.uri, first_key, check_bucket=False)
        self._bucket_checked.set()

    def _call(
        self, what: str, uri: str, operation: Callable[[], T], *, check_bucket: bool = True
    ) -> T:
        if check_bucket:
            self._check_bucket()

        def unavailable(last: BaseException, attempts: int, failing_s: float) -> StorageError:
            return StorageUnavailable(
                f"S3 endpoint {self.endpoint_url} unavailable: {what} {uri} failed "
                f"{attempts} {'attempt' if attempts == 1 else 'attempts'} over "
                f"{failing_s:.1f} s; last error: {_describe(last)}"
            )

        try:
            return self.retry.call(operation, transient=_is_transient, give_up=unavailable)
        except StorageError:
            raise
        except Exception as exc:
            raise self._permanent_error(what, uri, exc) from exc

    def _not_found(self, key: str) -> StorageNotFound:
        return StorageNotFound(f"{self.uri_of(key)} does not exist")

    def _permanent_error(self, what: str, uri: str, exc: Exception) -> StorageError:
        at = f"at {self.endpoint_url}"
        if isinstance(exc, S3Error):
            if exc.code == "NoSuchKey":
                return StorageNotFound(f"{uri} does not exist")
            if exc.code == "NoSuchBucket":
                return StorageError(
                    f"bucket {self.bucket!r} does not exist {at} (create it or fix the URI {uri})"
                )
            if exc.code in _CREDENTIAL_CODES:
                return StorageError(
                    f"{self.endpoint_url} rejected the credentials ({exc.code}) while trying to "
                    f"{what} {uri}: check {self.credentials.source}"
                )
            if exc.code == "AccessDenied":
                return StorageError(
                    f"access denied {at} to {what} {uri} with the credentials from "
                    f"{self.credentials.source}"
                )
            return StorageError(f"cannot {what} {uri} {at}: {exc.code}: {exc.message}")
        if isinstance(exc, urllib3.exceptions.SSLError):
            return StorageError(
                f"TLS with {self.endpoint_url} failed while trying to {what} {uri}: {exc} "
                "(AWS_CA_BUNDLE / SSL_CERT_FILE name the CA to trust)"
            )
        if isinstance(exc, OSError):
            return StorageError(f"cannot {what} {uri}: {exc.strerror or exc}")
        return StorageError(f"cannot {what} {uri} {at}: {_describe(exc)}")


def _status_of(exc: BaseException) -> int | None:
    if isinstance(exc, S3Error):
        return int(exc.response.status) if exc.response is not None else None
    if isinstance(exc, ServerError):
        return exc.status_code
    if isinstance(exc, InvalidResponseError):
        code = getattr(exc, "_code", None)
        return code if isinstance(code, int) else None
    return None


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, S3Error) and exc.code in _TRANSIENT_CODES:
        return True
    status = _status_of(exc)
    if status is not None:
        return status >= 500 or status == 429
    if isinstance(exc, urllib3.exceptions.SSLError):
        return False
    # Refused, reset, closed mid-body, timed out.
    return isinstance(exc, urllib3.exceptions.HTTPError | ConnectionError | TimeoutError)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, urllib3.exceptions.NewConnectionError):
        return f"cannot connect ({str(exc).rpartition(': ')[2]})"
    if isinstance(exc, S3Error):
        return f"{exc.code}: {exc.message}"
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text[:300]}"
