"""Progress lines on stderr while perfdiag waits, between the training's own output."""

from __future__ import annotations

import contextlib
import re
import sys
import time
from collections.abc import Callable
from typing import TextIO

# Written to a file or a pipe (a CI log, `2> run.log`), a waiting status that only counts on
# (steps, ranks done) is repeated at most this often; a new kind of status is shown at once.
LOG_REPEAT_S = 30.0
_COUNTS = re.compile(r"\d+(?:\.\d+)?")
_DETAIL = re.compile(r"\([^()]*\)")


class Progress:
    """Prints `perfdiag: <message>` lines; a repeated message is not printed again, and a
    changing status line (`status`) at most every `min_interval_s`. When the stream is not a
    terminal, a status is printed only when its phase changes (its words: numbers and
    parenthesized details aside), or when the last line is `log_repeat_s` old."""

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        quiet: bool = False,
        min_interval_s: float = 2.0,
        log_repeat_s: float = LOG_REPEAT_S,
        terminal: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.quiet = quiet
        self.min_interval_s = min_interval_s
        self.log_repeat_s = log_repeat_s
        self.terminal = _is_terminal(self.stream) if terminal is None else terminal
        self._clock = clock
        self._last_message = ""
        self._last_phase = ""
        # None: no status shown yet (not 0.0: the monotonic clock starts near boot, so a
        # fresh machine's clock can be younger than the interval).
        self._last_status_at: float | None = None
        self._last_line_at: float | None = None  # any line, milestones too

    def __call__(self, message: str) -> None:
        """A milestone: always shown (unless it repeats the previous line)."""
        if message == self._last_message:
            return
        self._emit(message)

    def status(self, message: str) -> None:
        """A waiting status that may change often: shown when it changed, rate-limited."""
        now = self._clock()
        if message == self._last_message:
            return
        since = None if self._last_status_at is None else now - self._last_status_at
        if since is not None and since < self.min_interval_s:
            return
        phase = status_phase(message)
        quiet_for = None if self._last_line_at is None else now - self._last_line_at
        if (
            not self.terminal
            and phase == self._last_phase
            and quiet_for is not None
            and quiet_for < self.log_repeat_s
        ):
            return  # only the counts moved: a log need not hear of it yet
        self._last_status_at = now
        self._last_phase = phase
        self._emit(message)

    def _emit(self, message: str) -> None:
        self._last_message = message
        self._last_line_at = self._clock()
        if self.quiet:
            return
        with contextlib.suppress(OSError, ValueError):  # our stderr is gone: nothing to tell
            print(f"perfdiag: {message}", file=self.stream, flush=True)


def status_phase(message: str) -> str:
    """What a status says apart from its counts: `capturing on 4 ranks: 1 done, 3 before step
    5 (all at step 3)…` and the same at step 4 are one phase; `… 3 capturing …` is another."""
    return _COUNTS.sub("#", _DETAIL.sub("()", message))


def _is_terminal(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, OSError, ValueError):
        return False
