"""The training job as a child process: torchrun with the hook's environment, its output passed
through (and its last lines kept for error messages), signals forwarded."""

from __future__ import annotations

import codecs
import collections
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from types import FrameType
from typing import IO, BinaryIO

from perfdiag.local.native_log import NativeLog, NoiseFilter

# Enough to find the first failed rank's traceback above torchrun's own report.
TAIL_LINES = 500


class OutputTail:
    """The last lines written by the training, whichever stream they came on."""

    def __init__(self, max_lines: int = TAIL_LINES) -> None:
        self._lines: collections.deque[str] = collections.deque(maxlen=max_lines)
        self._partial: dict[str, str] = {}
        self._decoders: dict[str, codecs.IncrementalDecoder] = {}
        self._lock = threading.Lock()

    def feed(self, stream: str, data: bytes) -> None:
        decoder = self._decoders.setdefault(
            stream, codecs.getincrementaldecoder("utf-8")(errors="replace")
        )
        text = self._partial.get(stream, "") + decoder.decode(data)
        *complete, rest = text.replace("\r\n", "\n").split("\n")
        with self._lock:
            self._lines.extend(complete)
            self._partial[stream] = rest[-4096:]

    def lines(self) -> list[str]:
        with self._lock:
            pending = [text for text in self._partial.values() if text.strip()]
            return [*self._lines, *pending][-self._lines.maxlen :] if self._lines.maxlen else []


def _pump(
    source: IO[bytes],
    sink: BinaryIO,
    stream: str,
    tail: OutputTail,
    native_log: NativeLog | None = None,
) -> None:
    """Copy a child's stream as it comes (chunks, not lines: progress bars use \\r), the
    profiler's own log lines to `native_log` when there is one."""
    read = getattr(source, "read1", source.read)
    noise = NoiseFilter()
    while True:
        try:
            chunk = read(65536)
        except (OSError, ValueError):
            chunk = b""
        if native_log is None:
            shown = chunk
        else:
            shown, routed = noise.feed(chunk) if chunk else noise.finish()
            native_log.write(routed)
        if shown:
            tail.feed(stream, shown)
            try:
                sink.write(shown)
                sink.flush()
            except (OSError, ValueError):
                pass  # our own stream is gone (closed pipe); keep draining the child
        if not chunk:
            return


def _die_with_parent() -> None:
    """Run in the child before exec: its own process group (our Ctrl-C handling forwards the
    signal once, as a terminal would), and SIGTERM when perfdiag dies, so no orphaned
    training keeps running."""
    os.setpgid(0, 0)
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            pr_set_pdeathsig = 1
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
        except (OSError, AttributeError):
            pass


class TrainingProcess:
    """torchrun running the user's job. Output passes through to our stdout/stderr (or both to
    stderr when stdout is reserved for machine-readable output); with a `native_log`, the
    profiler's own log lines on stderr go there instead."""

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        *,
        stdout_to_stderr: bool,
        native_log: NativeLog | None = None,
    ) -> None:
        self.argv = argv
        self.tail = OutputTail()
        self.started = time.monotonic()
        self.interrupts = 0
        self._process = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=_die_with_parent,
        )
        out_sink = sys.stderr.buffer if stdout_to_stderr else sys.stdout.buffer
        assert self._process.stdout is not None and self._process.stderr is not None
        self._pumps = [
            threading.Thread(
                target=_pump,
                args=(self._process.stdout, out_sink, "stdout", self.tail),
                daemon=True,
            ),
            threading.Thread(
                target=_pump,
                # Native libraries log on stderr only: stdout is left exactly as printed.
                args=(self._process.stderr, sys.stderr.buffer, "stderr", self.tail, native_log),
                daemon=True,
            ),
        ]
        for pump in self._pumps:
            pump.start()

    @property
    def pid(self) -> int:
        return self._process.pid

    def poll(self) -> int | None:
        """The exit code once torchrun has exited and its output is drained, else None."""
        code = self._process.poll()
        if code is not None:
            self._drain()
        return code

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            code = self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self._drain()
        return code

    def _drain(self) -> None:
        for pump in self._pumps:
            pump.join(timeout=5)

    def signal_group(self, signum: int) -> None:
        """Send a signal to torchrun and its workers, as a terminal's Ctrl-C would."""
        with contextlib.suppress(ProcessLookupError):  # already gone
            os.killpg(self._process.pid, signum)

    def stop(self, grace_s: float = 30.0) -> None:
        """End the training: SIGTERM, then SIGKILL after `grace_s`."""
        if self._process.poll() is not None:
            self._drain()
            return
        self.signal_group(signal.SIGTERM)
        if self.wait(grace_s) is None:
            self.signal_group(signal.SIGKILL)
            self.wait(10)


class SignalForwarding:
    """While active, SIGINT/SIGTERM sent to perfdiag go to the training instead of killing us:
    the first one asks it to stop (torchrun then stops its workers), a second one kills it."""

    def __init__(self, training: TrainingProcess) -> None:
        self.training = training
        self.received: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> SignalForwarding:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signum
            self.training.signal_group(signum)
        else:
            self.training.signal_group(signal.SIGKILL)
            raise KeyboardInterrupt
