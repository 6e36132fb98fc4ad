"""Helpers of the hook tests: the materialized hook folder, training subprocesses, waits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from perfdiag.api.plan import Plan
from perfdiag.collector.hook import spool
from perfdiag.collector.hookdir import materialize

HERE = Path(__file__).resolve().parent
TRAIN_LOOP = HERE / "train_loop.py"
WAIT_S = 120.0  # generous: the test machine is small and shared
HOOK_LOG_MARK = "perfdiag hook"


def wait_until(predicate: Callable[[], Any], what: str, timeout: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


@dataclass
class Finished:
    returncode: int
    stdout: str
    stderr: str

    @property
    def result(self) -> dict[str, Any]:
        lines = [line for line in self.stdout.splitlines() if line.startswith("{")]
        assert self.returncode == 0 and lines, (
            f"training failed ({self.returncode}):\n{self.stderr}"
        )
        value: dict[str, Any] = json.loads(lines[-1])
        return value

    def hook_log(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if HOOK_LOG_MARK in line]


@dataclass
class Training:
    """A running train_loop.py whose stderr is read as it comes."""

    proc: subprocess.Popen[str]
    stderr_lines: list[str] = field(default_factory=list)
    stdout_lines: list[str] = field(default_factory=list)
    _readers: list[threading.Thread] = field(default_factory=list)

    def start_readers(self) -> None:
        for stream, sink in (
            (self.proc.stderr, self.stderr_lines),
            (self.proc.stdout, self.stdout_lines),
        ):
            reader = threading.Thread(target=_drain, args=(stream, sink), daemon=True)
            reader.start()
            self._readers.append(reader)

    def hook_log(self) -> list[str]:
        return [line for line in list(self.stderr_lines) if HOOK_LOG_MARK in line]

    def wait_log(self, text: str, count: int = 1) -> None:
        wait_until(
            lambda: (
                sum(text in line for line in self.hook_log()) >= count
                or self.proc.poll() is not None
            ),
            f"hook log line {text!r}",
        )
        assert sum(text in line for line in self.hook_log()) >= count, "\n".join(self.stderr_lines)

    def finish(self, timeout: float = 300.0) -> Finished:
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        for reader in self._readers:
            reader.join(timeout=10)
        return Finished(
            self.proc.returncode, "\n".join(self.stdout_lines), "\n".join(self.stderr_lines)
        )


def _drain(stream: Any, sink: list[str]) -> None:
    for line in stream:
        sink.append(line.rstrip("\n"))


@dataclass
class HookEnv:
    """Paths of one hooked run."""

    hook_dir: Path
    spool: Path
    plan: Path
    tmp: Path

    def env(self, **extra: str) -> dict[str, str]:
        env = clean_env()
        env["PYTHONPATH"] = str(self.hook_dir)
        env["PERFDIAG_SPOOL"] = str(self.spool)
        env["PERFDIAG_PLAN"] = str(self.plan)
        env.update(extra)
        return env

    def heartbeat(self, rank: int = 0) -> dict[str, Any]:
        value = spool.read_json(spool.rank_dir(self.spool, rank) / spool.HEARTBEAT)
        return value if isinstance(value, dict) else {}

    def hook_meta(self, plan_id: str, rank: int = 0) -> dict[str, Any] | None:
        value = spool.read_json(spool.window_dir(self.spool, rank, plan_id) / spool.HOOK_META)
        return value if isinstance(value, dict) else None

    def wait_hook_meta(self, plan_id: str, rank: int = 0) -> dict[str, Any]:
        meta: dict[str, Any] = wait_until(
            lambda: self.hook_meta(plan_id, rank), f"hook.json of plan {plan_id}"
        )
        return meta

    def write_plan(self, plan: Plan) -> None:
        plan.write_atomic(self.plan)

    def start(self, *args: str, env: dict[str, str] | None = None) -> Training:
        return start_training(list(args), self.env() if env is None else env)

    def trace_events(self, plan_id: str, rank: int = 0) -> list[dict[str, Any]]:
        path = spool.window_dir(self.spool, rank, plan_id) / spool.TRACE
        events: list[dict[str, Any]] = json.loads(path.read_text())["traceEvents"]
        return events

    @staticmethod
    def profiler_steps(events: list[dict[str, Any]]) -> list[int]:
        """The n of every "ProfilerStep#n" range, sorted."""
        return sorted(
            int(event["name"].split("#", 1)[1])
            for event in events
            if str(event.get("name", "")).startswith("ProfilerStep#")
        )

    wait_until = staticmethod(wait_until)


def clean_env() -> dict[str, str]:
    """This process's environment without the hook's or torchrun's variables."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("PERFDIAG_")
        and key not in ("PYTHONPATH", "RANK", "LOCAL_RANK", "WORLD_SIZE", "POD_NAME")
    }
    env["PYTHONHASHSEED"] = "0"
    return env


def start_training(args: list[str], env: dict[str, str]) -> Training:
    proc = subprocess.Popen(
        [sys.executable, str(TRAIN_LOOP), *args],
        env=env,
        cwd=HERE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    training = Training(proc)
    training.start_readers()
    return training


def run_plain(*args: str) -> Finished:
    """The training with no hook at all: the reference results."""
    return start_training(list(args), clean_env()).finish()


@pytest.fixture(scope="session")
def hook_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return materialize(tmp_path_factory.mktemp("hook") / "hook")


@pytest.fixture
def hooked(hook_dir: Path, tmp_path: Path) -> Iterator[HookEnv]:
    yield HookEnv(
        hook_dir=hook_dir, spool=tmp_path / "spool", plan=tmp_path / "plan.json", tmp=tmp_path
    )


_baselines: dict[tuple[str, ...], dict[str, Any]] = {}


@pytest.fixture(scope="session")
def baseline() -> Callable[..., dict[str, Any]]:
    """Reference results of train_loop.py for given arguments (run once per session)."""

    def get(*args: str) -> dict[str, Any]:
        if args not in _baselines:
            _baselines[args] = run_plain(*args).result
        return _baselines[args]

    return get
