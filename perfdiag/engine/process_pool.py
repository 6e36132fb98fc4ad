"""An ordered map over child interpreters, for CPU work that holds the GIL.

The standard library's process pools either fork (copying the threads and locks of a process
that may hold them: the analyzer runs its own thread pools and Arrow's) or spawn, which runs the
caller's `__main__` again in every child: a script without an `if __name__ == "__main__":`
guard would run twice. Here each child is a fresh `python -m perfdiag.engine.process_pool` that
imports only the function's module, reads pickled tasks on stdin and writes pickled results on
stdout.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pickle
import queue
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class ProcessPoolError(RuntimeError):
    """A child interpreter could not start, died, or failed a task."""


def map_in_processes(function: Callable[[T], R], tasks: Iterable[T], width: int) -> Iterator[R]:
    """`function` (a module-level function) over `tasks` in `width` child interpreters; the
    results in the order of the tasks. Raises ProcessPoolError."""
    target = (function.__module__, function.__qualname__)
    children: list[subprocess.Popen[bytes]] = []
    idle: queue.Queue[subprocess.Popen[bytes]] = queue.Queue()
    try:
        for _ in range(width):
            child = subprocess.Popen(
                [sys.executable, "-m", "perfdiag.engine.process_pool"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                cwd="/",  # -m puts the working directory first on sys.path: nothing in the
                # user's folder may stand in for a module the child imports
            )
            children.append(child)
            idle.put(child)
    except OSError as exc:
        _stop(children)
        raise ProcessPoolError(f"cannot start a child interpreter: {exc}") from exc

    def round_trip(task: T) -> R:
        child = idle.get()
        try:
            assert child.stdin is not None and child.stdout is not None
            pickle.dump((target, task), child.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            child.stdin.flush()
            ok, value = pickle.load(child.stdout)
        except (OSError, EOFError, pickle.UnpicklingError) as exc:
            raise ProcessPoolError(f"a child interpreter died (exit {child.poll()})") from exc
        finally:
            idle.put(child)  # a dead one too: the tasks waiting for it fail at once
        if not ok:
            raise ProcessPoolError(f"a child interpreter failed a task: {value}")
        result: R = value
        return result

    # One thread per child: each waits on its pipe with the GIL released.
    pool = ThreadPoolExecutor(max_workers=width)
    try:
        yield from pool.map(round_trip, tasks)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # a failure or a caller that stopped
        _stop(children)


def _stop(children: list[subprocess.Popen[bytes]]) -> None:
    for child in children:
        if child.stdin is not None:
            with contextlib.suppress(OSError):
                child.stdin.close()  # end of tasks: the child returns
    for child in children:
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()


def _serve(tasks: IO[bytes], results: IO[bytes]) -> None:
    functions: dict[tuple[str, str], Callable[[Any], Any]] = {}
    while True:
        try:
            target, task = pickle.load(tasks)
        except EOFError:
            return
        try:
            if target not in functions:
                functions[target] = getattr(importlib.import_module(target[0]), target[1])
            reply: tuple[bool, Any] = (True, functions[target](task))
        except Exception as exc:  # reported to the parent, which raises it there
            reply = (False, f"{type(exc).__name__}: {exc}")
        pickle.dump(reply, results, protocol=pickle.HIGHEST_PROTOCOL)
        results.flush()


if __name__ == "__main__":
    # Results go to the real stdout; anything a module prints goes to stderr instead.
    _results = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    _serve(sys.stdin.buffer, _results)
