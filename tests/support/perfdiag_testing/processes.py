"""One server process of the test control plane: free ports, a log file, readiness, clean stop."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path


class ServerStartError(RuntimeError):
    """A server did not come up; the message carries the tail of its log."""

    def __init__(self, message: str, *, port_conflict: bool = False) -> None:
        super().__init__(message)
        self.port_conflict = port_conflict


def free_port(host: str = "127.0.0.1") -> int:
    """A port that is free right now. Another process may take it before the server binds it,
    so starters retry on 'address already in use' (ServerStartError.port_conflict)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _death_signal_prefix() -> list[str]:
    # The kernel kills the server when pytest dies without tearing down (SIGKILL, OOM), so no
    # orphaned apiserver keeps eating a CI core. setpriv ships with util-linux.
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []


class ServerProcess:
    """A server started in its own process group, output appended to `log_path`."""

    def __init__(
        self, name: str, argv: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = dict(env) if env is not None else dict(os.environ)
        self._popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the server. The kernel's parent-death signal follows the *thread* that forks,
        so start servers from a thread that outlives them (the main thread)."""
        if self.running():
            raise RuntimeError(f"{self.name} is already running")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(
                f"\n=== {time.strftime('%H:%M:%S')} starting: {' '.join(self.argv)}\n".encode()
            )
            log.flush()
            self._popen = subprocess.Popen(
                [*_death_signal_prefix(), *self.argv],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen else None

    def running(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def stop(self, *, kill: bool = False, timeout: float = 15.0) -> None:
        """SIGTERM (or SIGKILL with kill=True) to the whole process group, then wait."""
        popen = self._popen
        if popen is None:
            return
        if popen.poll() is None:
            self._signal_group(popen.pid, signal.SIGKILL if kill else signal.SIGTERM)
            try:
                popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self._signal_group(popen.pid, signal.SIGKILL)
                popen.wait(timeout)
        # Children left in the group (none expected) go too.
        self._signal_group(popen.pid, signal.SIGKILL)
        self._popen = None

    @staticmethod
    def _signal_group(pgid: int, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def wait_ready(self, probe: Callable[[], bool], timeout: float, what: str = "ready") -> float:
        """Poll `probe` until it returns True; returns the seconds waited. Raises ServerStartError
        with the log tail when the process exits or `timeout` passes first."""
        start = time.monotonic()
        while True:
            if not self.running():
                code = self._popen.returncode if self._popen else None
                tail = self.log_tail()
                raise ServerStartError(
                    f"{self.name} exited (code {code}) before it was {what}; "
                    f"log {self.log_path}, last lines:\n{tail}",
                    port_conflict="address already in use" in tail.lower(),
                )
            if probe():
                return time.monotonic() - start
            if time.monotonic() - start > timeout:
                raise ServerStartError(
                    f"{self.name} was not {what} after {timeout:.0f} s; "
                    f"log {self.log_path}, last lines:\n{self.log_tail()}"
                )
            time.sleep(0.1)
