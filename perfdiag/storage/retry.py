"""The one retry and backoff policy of storage operations.

Two callers wait the same way, exponential backoff with jitter (half of each delay fixed, half
random, so that clients failing together spread out), capped:

- S3Storage retries one operation through transient failures, blocking (`RetryPolicy.call`, on
  tenacity), for a bounded time counted from its first failure, then gives up.
- The collector agent postpones a failed upload without blocking its loop (the other ranks'
  heartbeats go on), by `RetryPolicy.delay` of its consecutive failures, and never gives up.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn, TypeVar

import tenacity
from tenacity import RetryCallState

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    max_elapsed_s: float = 60.0
    """How long one operation keeps trying, counted from its first failure."""
    initial_delay_s: float = 0.2
    max_delay_s: float = 5.0

    def delay(self, failures: int) -> float:
        """The wait after the `failures`-th failure in a row (1: the first)."""
        nominal = min(self.initial_delay_s * 2.0 ** min(failures - 1, 64), self.max_delay_s)
        return nominal / 2 + random.uniform(0, nominal / 2)

    def call(
        self,
        operation: Callable[[], T],
        *,
        transient: Callable[[BaseException], bool],
        give_up: Callable[[BaseException, int, float], Exception],
    ) -> T:
        """`operation()`, tried again after each `transient` error while the next attempt would
        begin within `max_elapsed_s` of the first failure; then `give_up(last error, attempts,
        seconds failing)` is raised from the last error. Other errors propagate at once."""
        first_failure: float | None = None

        def failing_for(state: RetryCallState) -> float:
            nonlocal first_failure
            now = state.outcome_timestamp or 0.0
            first_failure = now if first_failure is None else first_failure
            return now - first_failure

        def out_of_time(state: RetryCallState) -> bool:
            # Counted from the first failure (tenacity's stop_before_delay counts from the first
            # attempt): a long upload that fails late still gets its full share of retries.
            return failing_for(state) + state.upcoming_sleep > self.max_elapsed_s

        def raise_give_up(state: RetryCallState) -> NoReturn:
            last = state.outcome.exception() if state.outcome is not None else None
            assert last is not None  # only called after a failed attempt
            raise give_up(last, state.attempt_number, failing_for(state)) from last

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(transient),
            wait=lambda state: self.delay(state.attempt_number),
            stop=out_of_time,
            retry_error_callback=raise_give_up,
        )
        return retrying(operation)
