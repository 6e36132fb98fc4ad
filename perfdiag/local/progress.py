"""Progress lines on stderr while perfdiag waits, between the training's own output."""

from __future__ import annotations

import contextlib
import sys
import time
from typing import TextIO


class Progress:
    """Prints `perfdiag: <message>` lines; a repeated message is not printed again, and a
    changing status line (`status`) at most every `min_interval_s`."""

    def __init__(
        self, stream: TextIO | None = None, *, quiet: bool = False, min_interval_s: float = 2.0
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.quiet = quiet
        self.min_interval_s = min_interval_s
        self._last_message = ""
        # None: no status shown yet (not 0.0: the monotonic clock starts near boot, so a
        # fresh machine's clock can be younger than the interval).
        self._last_status_at: float | None = None

    def __call__(self, message: str) -> None:
        """A milestone: always shown (unless it repeats the previous line)."""
        if message == self._last_message:
            return
        self._emit(message)

    def status(self, message: str) -> None:
        """A waiting status that may change often: shown when it changed, rate-limited."""
        now = time.monotonic()
        if message == self._last_message:
            return
        if self._last_status_at is not None and now - self._last_status_at < self.min_interval_s:
            return
        self._last_status_at = now
        self._emit(message)

    def _emit(self, message: str) -> None:
        self._last_message = message
        if self.quiet:
            return
        with contextlib.suppress(OSError, ValueError):  # our stderr is gone: nothing to tell
            print(f"perfdiag: {message}", file=self.stream, flush=True)
