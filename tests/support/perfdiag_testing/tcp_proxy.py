"""A loopback TCP proxy that caps the client→server rate and counts the bytes it forwarded.

Loopback uploads finish in well under a second; going through this proxy makes "the endpoint
goes away in the middle of an upload" something a test can time exactly (stop the server once
`bytes_up` passes a mark) instead of a race.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

_CHUNK = 64 << 10


class ThrottledTcpProxy:
    def __init__(self, target_host: str, target_port: int, bytes_per_second: float) -> None:
        self.target = (target_host, target_port)
        self.bytes_per_second = bytes_per_second
        self.bytes_up = 0
        self._lock = threading.Lock()
        self._next_send = time.monotonic()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._sockets: set[socket.socket] = set()
        self._closed = False
        threading.Thread(target=self._accept_loop, name="proxy-accept", daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()  # server down: the client sees the connection dropped
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets.update((client, upstream))
            pumps_left = [2]  # the second pump to finish closes both sockets
            for source, sink, throttle in ((client, upstream, True), (upstream, client, False)):
                threading.Thread(
                    target=self._pump, args=(source, sink, throttle, pumps_left), daemon=True
                ).start()

    def _wait_for_budget(self, size: int) -> None:
        with self._lock:
            now = time.monotonic()
            start = max(now, self._next_send)
            self._next_send = start + size / self.bytes_per_second
            self.bytes_up += size
        if start > now:
            time.sleep(start - now)

    def _pump(
        self, source: socket.socket, sink: socket.socket, throttle: bool, pumps_left: list[int]
    ) -> None:
        try:
            while True:
                data = source.recv(_CHUNK)
                if not data:
                    break
                if throttle:
                    self._wait_for_budget(len(data))
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            with self._lock:
                pumps_left[0] -= 1
                last = pumps_left[0] == 0
                if last:
                    self._sockets.difference_update((source, sink))
            if last:
                source.close()
                sink.close()

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, set()
        for sock in sockets:
            sock.close()
