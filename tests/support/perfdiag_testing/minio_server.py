"""A real MinIO server for tests: loopback port, generated root credentials, a fresh bucket.

stop()/start() simulate an outage: the restart reuses the port and the data directory.
"""

from __future__ import annotations

import os
import secrets
import time
import urllib.error
import urllib.request
from pathlib import Path

import urllib3
from minio import Minio
from minio.error import MinioException

from perfdiag_testing.processes import ServerProcess, ServerStartError, free_port

REGION = "us-east-1"  # MinIO's default region
START_ATTEMPTS = 3


class MinioServer:
    def __init__(self, binary: Path, workdir: Path) -> None:
        self.binary = binary
        self.workdir = workdir
        self.data_dir = workdir / "minio-data"
        self.access_key = f"perfdiag-{secrets.token_hex(4)}"
        self.secret_key = secrets.token_urlsafe(24)
        self.bucket = f"perfdiag-test-{secrets.token_hex(4)}"
        self.port = 0
        self.console_port = 0
        self.ready_seconds = 0.0
        self.process: ServerProcess | None = None

    @property
    def endpoint(self) -> str:
        """host:port, as the minio client takes it."""
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.endpoint}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "logs" / "minio.log"

    def env(self) -> dict[str, str]:
        """The standard variables an S3 client (and `perfdiag … s3://`) reads."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_ENDPOINT_URL": self.url,
            "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION,
            "NO_PROXY": "127.0.0.1,localhost",
        }

    def client(self) -> Minio:
        """An admin minio client; its own retries are off so outages show at once."""
        http = urllib3.PoolManager(timeout=urllib3.Timeout(connect=2, read=60), retries=False)
        return Minio(
            self.endpoint,
            access_key=self.access_key,
            secret_key=self.secret_key,
            secure=False,
            region=REGION,
            http_client=http,
        )

    def _process(self) -> ServerProcess:
        env = {
            **os.environ,
            "MINIO_ROOT_USER": self.access_key,
            "MINIO_ROOT_PASSWORD": self.secret_key,
            "MINIO_BROWSER": "off",
            "MINIO_UPDATE": "off",
            "MINIO_REGION": REGION,
            # Keep MinIO's config (~/.minio) out of the user's home.
            "HOME": str(self.workdir / "minio-home"),
        }
        argv = [
            str(self.binary),
            "server",
            str(self.data_dir),
            f"--address={self.endpoint}",
            f"--console-address=127.0.0.1:{self.console_port}",
            f"--certs-dir={self.workdir / 'minio-certs'}",
            "--quiet",
        ]
        return ServerProcess("minio", argv, self.log_path, env)

    def _ready(self) -> bool:
        # /minio/health/ready can answer 200 while S3 requests still get
        # XMinioServerNotInitialized: ready means an authenticated S3 call works too.
        try:
            with urllib.request.urlopen(f"{self.url}/minio/health/ready", timeout=2) as response:
                if response.status != 200:
                    return False
            self.client().list_buckets()
        except (urllib.error.URLError, OSError, MinioException, urllib3.exceptions.HTTPError):
            return False
        return True

    def start(self, timeout: float = 60) -> None:
        """Start (or restart, same port and data) and wait until MinIO is ready. Call it from
        a thread that outlives the server (the main thread): see ServerProcess.start."""
        started = time.monotonic()
        first = self.port == 0
        for attempt in range(1, START_ATTEMPTS + 1):
            if first:
                self.port, self.console_port = free_port(), free_port()
            self.process = self._process()
            self.process.start()
            try:
                self.process.wait_ready(self._ready, timeout=timeout)
            except ServerStartError as exc:
                self.process.stop(kill=True)
                if not (first and exc.port_conflict) or attempt == START_ATTEMPTS:
                    raise
                continue
            break
        if first:
            self.client().make_bucket(self.bucket)
        self.ready_seconds = time.monotonic() - started

    def stop(self, *, kill: bool = False) -> None:
        """Take the endpoint away (SIGTERM, or SIGKILL with kill=True, as a crash would)."""
        if self.process is not None:
            self.process.stop(kill=kill)

    def running(self) -> bool:
        return self.process is not None and self.process.running()

    def log_files(self) -> list[Path]:
        return [self.log_path]


def start_minio(binary: Path, workdir: Path) -> MinioServer:
    server = MinioServer(binary, workdir)
    server.start()
    return server
