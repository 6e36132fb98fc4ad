"""Tasks for tests of perfdiag.engine.process_pool: a child interpreter imports a task by module
name, so they live in the installed package."""

from __future__ import annotations

import os


def square_and_pid(value: int) -> tuple[int, int]:
    print("noise on stdout must not reach the results")
    return value * value, os.getpid()


def fail_on_three(value: int) -> int:
    if value == 3:
        raise ValueError("three is refused")
    return value


def die(value: int) -> int:
    os._exit(7)
