"""Many small GETs and PUTs of S3 objects at once: signed HTTP/1.1 requests on kept-alive
sockets.

Reading a capture of 100,000 workers from S3 is 200,000 GETs of a few KB, and arming 10,000 pods
is 10,000 PUTs of a plan. Through the minio client each costs ~0.55 ms of CPU (URL building,
signing, urllib3, header parsing), which on a 2-core machine made the client, not the network or
the server, the limit. Here a request is a few preformatted lines signed with a signing key kept
for the day (AWS Signature V4), sent on a socket each thread keeps open, and the answer parsed by
hand: ~0.1 ms. Only the plain case is handled: a 200 with a Content-Length. Anything else (an
error status, a redirect, a dropped connection, a timeout) is left to the caller, which asks the
minio client again for that key: its retries and its error messages stay the only ones.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import quote, unquote_plus

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
MAX_HEADER_BYTES = 64 << 10
READ_SIZE = 256 << 10


class NotPlain(Exception):
    """The answer was not a plain 200 with its body: ask the full client."""


@dataclass(frozen=True)
class Endpoint:
    """Where objects are and how their requests are addressed (from the minio client's URL of
    one object: path-style for MinIO, virtual-host-style for AWS)."""

    scheme: str
    host: str
    """host[:port] as sent in the Host header."""
    path_prefix: str
    """The request path of an object is this plus its quoted name."""
    bucket_path: str
    """The request path of the bucket (listings)."""
    region: str
    tls: ssl.SSLContext | None = None
    timeout_s: float = 60.0


@dataclass(frozen=True)
class Keys:
    access_key: str | None
    secret_key: str | None
    session_token: str | None = None


@dataclass
class _Signer:
    """AWS Signature V4 of requests, their body signed by its SHA-256 (as the minio client signs
    over http; over https too, where it would send UNSIGNED-PAYLOAD with a Content-MD5)."""

    endpoint: Endpoint
    keys: Keys
    _day: str = ""
    _key: bytes = b""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def headers(
        self,
        path: str,
        query: str,
        now: float,
        method: str = "GET",
        body_sha256: str = EMPTY_SHA256,
    ) -> str:
        """The request's headers; `query`: its canonical query string; `body_sha256`: the hex
        SHA-256 of its body."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
        lines = [
            f"Host: {self.endpoint.host}",
            f"x-amz-content-sha256: {body_sha256}",
            f"x-amz-date: {stamp}",
        ]
        if self.keys.access_key is None or self.keys.secret_key is None:
            return "\r\n".join(lines)  # anonymous: unsigned, as the minio client sends it
        day = stamp[:8]
        scope = f"{day}/{self.endpoint.region}/s3/aws4_request"
        signed = "host;x-amz-content-sha256;x-amz-date"
        canonical = [
            f"host:{self.endpoint.host}",
            f"x-amz-content-sha256:{body_sha256}",
            f"x-amz-date:{stamp}",
        ]
        if self.keys.session_token:
            signed += ";x-amz-security-token"
            canonical.append(f"x-amz-security-token:{self.keys.session_token}")
            lines.append(f"x-amz-security-token: {self.keys.session_token}")
        request = "\n".join([method, path, query, *canonical, "", signed, body_sha256])
        to_sign = "\n".join(
            [
                "AWS4-HMAC-SHA256",
                stamp,
                scope,
                hashlib.sha256(request.encode()).hexdigest(),
            ]
        )
        signature = hmac.new(self._signing_key(day), to_sign.encode(), hashlib.sha256)
        lines.append(
            f"Authorization: AWS4-HMAC-SHA256 Credential={self.keys.access_key}/{scope}, "
            f"SignedHeaders={signed}, Signature={signature.hexdigest()}"
        )
        return "\r\n".join(lines)

    def _signing_key(self, day: str) -> bytes:
        with self._lock:
            if day != self._day:
                assert self.keys.secret_key is not None
                key = ("AWS4" + self.keys.secret_key).encode()
                for part in (day, self.endpoint.region, "s3", "aws4_request"):
                    key = hmac.new(key, part.encode(), hashlib.sha256).digest()
                self._day, self._key = day, key
            return self._key


@dataclass(frozen=True)
class Answer:
    """A plain answer: its status and body."""

    status: int
    body: bytes

    @property
    def no_such_key(self) -> bool:
        """Whether it says that the object does not exist."""
        return self.status == 404 and b"<Code>NoSuchKey</Code>" in self.body


class _Connection:
    """One kept-alive HTTP/1.1 connection."""

    def __init__(self, endpoint: Endpoint) -> None:
        host, _, port = endpoint.host.rpartition(":")
        if not host:  # no port given
            host, port = endpoint.host, "443" if endpoint.tls else "80"
        sock = socket.create_connection((host, int(port)), timeout=endpoint.timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if endpoint.tls is not None:
            sock = endpoint.tls.wrap_socket(sock, server_hostname=host)
        self.sock = sock
        self.buffer = bytearray()
        self.closing = False

    def close(self) -> None:
        self.sock.close()

    def get(self, request: bytes) -> bytes:
        self.sock.sendall(request)
        answer = self.answer()
        if answer.status != 200:
            raise NotPlain("not a 200")
        return answer.body

    def answer(self) -> Answer:
        """The next answer on the connection; NotPlain when it cannot be read as a plain
        answer (the connection is then unusable)."""
        status, length, self.closing = _parse_head(self._head())
        return Answer(status, self._take(length))

    def _head(self) -> bytes:
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end >= 0:
                head = bytes(self.buffer[:end])
                del self.buffer[: end + 4]
                return head
            if len(self.buffer) > MAX_HEADER_BYTES:
                raise NotPlain("headers too long")
            self._fill()

    def _take(self, size: int) -> bytes:
        while len(self.buffer) < size:
            self._fill()
        body = bytes(self.buffer[:size])
        del self.buffer[:size]
        return body

    def _fill(self) -> None:
        chunk = self.sock.recv(READ_SIZE)
        if not chunk:
            raise NotPlain("connection closed")
        self.buffer += chunk


def _parse_head(head: bytes) -> tuple[int, int, bool]:
    """(status, Content-Length, whether the server closes) of a response head."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise NotPlain("not an HTTP/1.x response")
    length: int | None = None
    close = parts[0] == b"HTTP/1.0"
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length" and value.strip().isdigit():
            length = int(value.strip())
        elif name == b"transfer-encoding":
            raise NotPlain("chunked")
        elif name == b"connection":
            close = value.strip().lower() == b"close"
    if length is None:
        raise NotPlain("no Content-Length")
    return int(parts[1]), length, close


class BulkClient:
    """Plain GETs and PUTs of objects by name, one kept-alive connection per calling thread."""

    def __init__(self, endpoint: Endpoint, keys: Keys) -> None:
        self.endpoint = endpoint
        self.signer = _Signer(endpoint, keys)
        self.local = threading.local()

    def get(self, name: str) -> bytes:
        """The object's bytes; NotPlain (or OSError) when it is not a plain answer."""
        return self._get(self._path(name), {})

    def get_all(self, names: list[str]) -> list[Answer | None]:
        """The answers to GETs of the objects, their requests sent at once on one connection
        (HTTP/1.1 pipelining: one send and a few receives for all, not a round trip each); None
        for each object that the connection did not answer plainly."""
        now = time.time()
        requests = []
        for name in names:
            path = self._path(name)
            headers = self.signer.headers(path, "", now)
            requests.append(f"GET {path} HTTP/1.1\r\n{headers}\r\n\r\n".encode())
        return self._pipelined(requests)

    def put_all(self, objects: list[tuple[str, bytes]]) -> list[Answer | None]:
        """The answers to PUTs of the objects (name, bytes), pipelined on one connection as
        get_all's GETs are; None for each that the connection did not answer plainly. A PUT
        is whole or nothing: a request cut short stores no part of its object."""
        now = time.time()
        requests = []
        for name, data in objects:
            path = self._path(name)
            headers = self.signer.headers(path, "", now, "PUT", hashlib.sha256(data).hexdigest())
            head = (
                f"PUT {path} HTTP/1.1\r\n{headers}\r\nContent-Length: {len(data)}\r\n"
                "Content-Type: application/octet-stream\r\n\r\n"
            )
            requests.append(head.encode() + data)
        return self._pipelined(requests)

    def _path(self, name: str) -> str:
        return self.endpoint.path_prefix + quote(name, safe="/-_.~")

    def _pipelined(self, requests: list[bytes]) -> list[Answer | None]:
        """The answers to `requests`, sent at once on this thread's connection; None from the
        first that was not answered plainly on."""
        out: list[Answer | None] = [None] * len(requests)
        connection = self._connection()
        try:
            connection.sock.sendall(b"".join(requests))
            for i in range(len(requests)):
                out[i] = connection.answer()
                if connection.closing:
                    break  # the server answers no more on this connection
        except (NotPlain, OSError):
            connection.closing = True  # what is left of the answers is unusable
        if connection.closing:
            self.local.connection = None
            connection.close()
        return out

    def _connection(self) -> _Connection:
        connection: _Connection | None = getattr(self.local, "connection", None)
        if connection is None:
            connection = _Connection(self.endpoint)
            self.local.connection = connection
        return connection

    def get_bucket(self, query: dict[str, str]) -> bytes:
        """A GET of the bucket itself (a listing) with these query parameters."""
        return self._get(self.endpoint.bucket_path, query)

    def _get(self, path: str, query: dict[str, str]) -> bytes:
        canonical = "&".join(
            f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(query.items())
        )
        target = f"{path}?{canonical}" if canonical else path
        headers = self.signer.headers(path, canonical, time.time())
        request = f"GET {target} HTTP/1.1\r\n{headers}\r\n\r\n".encode()
        connection = self._connection()
        try:
            body = connection.get(request)
        except BaseException:
            # Whatever is left of that answer is unusable: the next request gets a new socket.
            self.local.connection = None
            connection.close()
            raise
        if connection.closing:
            self.local.connection = None
            connection.close()
        return body


_KEY = re.compile(rb"<Key>([^<]*)</Key>")
_TRUNCATED = re.compile(rb"<IsTruncated>true</IsTruncated>")
_TOKEN = re.compile(rb"<NextContinuationToken>([^<]*)</NextContinuationToken>")
PAGE_KEYS = 1000


def list_pages(client: BulkClient, prefix: str) -> Iterator[list[str]]:
    """The names under `prefix`, a ListObjectsV2 page at a time; NotPlain (or OSError) when an
    answer is not a plain listing."""
    query = {"list-type": "2", "prefix": prefix, "max-keys": str(PAGE_KEYS), "encoding-type": "url"}
    while True:
        body = client.get_bucket(query)
        if b"<ListBucketResult" not in body:
            raise NotPlain("not a listing")
        yield [unquote_plus(k.decode()) for k in _KEY.findall(body)]
        token = _TOKEN.search(body)
        if not _TRUNCATED.search(body):
            return
        if token is None:
            raise NotPlain("a truncated listing without a continuation token")
        query["continuation-token"] = unquote_plus(token.group(1).decode())
