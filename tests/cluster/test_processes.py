"""ServerProcess, the process handling under every test server (real processes, no binaries
needed: Python stands in for the server)."""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import pytest

from perfdiag_testing.processes import ServerProcess, ServerStartError, free_port


def _http_server(port: int, log: Path) -> ServerProcess:
    argv = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    return ServerProcess("http.server", argv, log)


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_start_wait_and_stop(tmp_path: Path) -> None:
    port = free_port()
    server = _http_server(port, tmp_path / "logs" / "http.log")
    server.start()
    try:
        waited = server.wait_ready(lambda: _listening(port), timeout=30)
        assert waited < 30
        assert server.running()
    finally:
        server.stop()
    assert not server.running()
    assert not _listening(port)
    assert "starting:" in (tmp_path / "logs" / "http.log").read_text()


def test_a_taken_port_is_reported_as_a_port_conflict(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        server = _http_server(port, tmp_path / "http.log")
        server.start()
        with pytest.raises(ServerStartError) as info:
            server.wait_ready(lambda: False, timeout=30)
    assert info.value.port_conflict
    assert "exited" in str(info.value)
    assert "Address already in use" in str(info.value)  # the log tail is in the message


def test_timeout_names_the_server_and_shows_its_log(tmp_path: Path) -> None:
    argv = [
        sys.executable,
        "-c",
        "print('still', 'warming up', flush=True); import time; time.sleep(60)",
    ]
    server = ServerProcess("slowpoke", argv, tmp_path / "slow.log")
    server.start()
    try:
        with pytest.raises(ServerStartError) as info:
            server.wait_ready(lambda: False, timeout=1.0)
    finally:
        server.stop()
    assert "slowpoke was not ready after 1 s" in str(info.value)
    assert "still warming up" in str(info.value)
    assert not info.value.port_conflict


def test_stop_takes_the_whole_process_group(tmp_path: Path) -> None:
    """A server that forks helpers (as MinIO does) leaves none of them behind."""
    pid_file = tmp_path / "child.pid"
    code = (
        "import subprocess, sys, time; "
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
        f"open({str(pid_file)!r}, 'w').write(str(child.pid)); time.sleep(120)"
    )
    server = ServerProcess("forker", [sys.executable, "-c", code], tmp_path / "forker.log")
    server.start()
    server.wait_ready(lambda: pid_file.exists() and bool(pid_file.read_text()), timeout=30)
    child = int(pid_file.read_text())
    server.stop(timeout=10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.05)
    assert not _alive(child)


@pytest.mark.parametrize("kill", [True, False])
def test_a_server_ignoring_sigterm_is_killed(tmp_path: Path, kill: bool) -> None:
    """kill=True sends SIGKILL at once; otherwise SIGKILL follows when SIGTERM did not work."""
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('handler installed:', 6 * 7, flush=True); time.sleep(120)"
    )
    log = tmp_path / "stubborn.log"
    server = ServerProcess("stubborn", [sys.executable, "-c", code], log)
    server.start()
    # (the log's first line quotes the code: wait for what only running it prints)
    server.wait_ready(lambda: "handler installed: 42" in log.read_text(), timeout=30)
    started = time.monotonic()
    server.stop(kill=kill, timeout=1.0)
    took = time.monotonic() - started
    assert not server.running()
    if kill:
        assert took < 0.9
    else:
        assert 0.9 < took < 5


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (reaped later by init) counts as gone.
    try:
        status = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return False
    return status != "Z"
