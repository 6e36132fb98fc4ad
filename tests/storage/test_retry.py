"""The storage retry policy (perfdiag.storage.retry) on its own: backoff, budget, giving up."""

from __future__ import annotations

import time

import pytest

from perfdiag.storage.retry import RetryPolicy


class Flaky(Exception):
    pass


class Broken(Exception):
    pass


class GaveUp(Exception):
    def __init__(self, last: BaseException, attempts: int, failing_s: float) -> None:
        super().__init__(f"{attempts} attempts over {failing_s:.2f} s: {last}")
        self.attempts, self.failing_s = attempts, failing_s


def _flaky(exc: BaseException) -> bool:
    return isinstance(exc, Flaky)


def test_backoff_grows_with_jitter_and_is_capped() -> None:
    policy = RetryPolicy(initial_delay_s=0.1, max_delay_s=1.0)
    for failures in range(1, 9):
        nominal = min(0.1 * 2 ** (failures - 1), 1.0)
        assert nominal / 2 <= policy.delay(failures) <= nominal
    assert len({policy.delay(1) for _ in range(20)}) > 1  # jittered: clients spread out
    assert policy.delay(10_000) <= 1.0  # an agent failing for days still waits the cap


def test_transient_errors_are_retried_until_the_operation_succeeds() -> None:
    attempts = []

    def operation() -> str:
        attempts.append(time.monotonic())
        if len(attempts) < 3:
            raise Flaky("connection refused")
        return "done"

    policy = RetryPolicy(max_elapsed_s=5, initial_delay_s=0.02, max_delay_s=0.05)
    assert policy.call(operation, transient=_flaky, give_up=GaveUp) == "done"
    assert len(attempts) == 3
    assert attempts[1] - attempts[0] >= 0.01  # it waited (half the first delay at least)


def test_other_errors_propagate_at_once() -> None:
    attempts = []

    def operation() -> None:
        attempts.append(1)
        raise Broken("access denied")

    with pytest.raises(Broken):
        RetryPolicy().call(operation, transient=_flaky, give_up=GaveUp)
    assert len(attempts) == 1


def test_gives_up_within_the_budget_from_the_last_error() -> None:
    def operation() -> None:
        raise Flaky("connection refused")

    policy = RetryPolicy(max_elapsed_s=0.3, initial_delay_s=0.02, max_delay_s=0.1)
    started = time.monotonic()
    with pytest.raises(GaveUp) as info:
        policy.call(operation, transient=_flaky, give_up=GaveUp)
    # It stops before a wait would end past the budget (slack: sleeps overrun on a busy machine).
    assert time.monotonic() - started < 0.3 + 1.0
    assert info.value.attempts > 2
    assert 0 < info.value.failing_s < 0.3 + 1.0
    assert isinstance(info.value.__cause__, Flaky)


def test_the_budget_counts_from_the_first_failure() -> None:
    """A long operation that fails late (a big upload) still gets its retries."""
    attempts = []

    def operation() -> str:
        attempts.append(1)
        if len(attempts) == 1:
            time.sleep(0.3)  # longer than the whole budget
            raise Flaky("reset mid-upload")
        return "done"

    policy = RetryPolicy(max_elapsed_s=0.2, initial_delay_s=0.02, max_delay_s=0.05)
    assert policy.call(operation, transient=_flaky, give_up=GaveUp) == "done"
    assert len(attempts) == 2
