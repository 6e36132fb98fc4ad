"""perfdiag.engine.process_pool: an ordered map over child interpreters."""

from __future__ import annotations

import os

import pytest

from perfdiag.engine.process_pool import ProcessPoolError, map_in_processes
from perfdiag_testing.pool_tasks import die, fail_on_three, square_and_pid


def test_results_come_in_task_order_from_several_children() -> None:
    results = list(map_in_processes(square_and_pid, range(20), 2))
    assert [square for square, _ in results] == [v * v for v in range(20)]
    pids = {pid for _, pid in results}
    assert os.getpid() not in pids
    assert 1 <= len(pids) <= 2


def test_a_failed_task_is_raised_with_its_message() -> None:
    with pytest.raises(ProcessPoolError, match="ValueError: three is refused"):
        list(map_in_processes(fail_on_three, range(5), 2))


def test_a_child_that_dies_is_an_error_not_a_hang() -> None:
    with pytest.raises(ProcessPoolError, match="died"):
        list(map_in_processes(die, range(3), 1))


def test_a_caller_that_stops_early_leaves_no_child_behind() -> None:
    results = map_in_processes(square_and_pid, range(1000), 2)
    _, pid = next(results)
    results.close()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
