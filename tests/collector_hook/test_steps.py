"""Step boundaries, in this process with real torch optimizers: what counts as one step."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch.optim import optimizer as optimizer_module

from perfdiag.collector import spool
from perfdiag.collector.hook import Hook


@pytest.fixture
def hook(tmp_path: Path) -> Iterator[Hook]:
    identity = {"rank": 0, "local_rank": 0, "world_size": 1, "host": "h", "pod": None, "pid": 1}
    hook = Hook(tmp_path / "spool", tmp_path / "plan.json", identity, poll_interval_s=0.05)
    hook.attach_optimizer_hook(optimizer_module)
    yield hook
    hook.close()


def train(optimizers: list[torch.optim.Optimizer], params: list[torch.Tensor]) -> None:
    loss = sum((p * p).sum() for p in params)
    assert isinstance(loss, torch.Tensor)
    loss.backward()
    for optimizer in optimizers:
        optimizer.step()


def test_two_optimizers_per_iteration_count_one_step(hook: Hook) -> None:
    params = [torch.ones(3, requires_grad=True), torch.ones(2, requires_grad=True)]
    optimizers: list[torch.optim.Optimizer] = [
        torch.optim.SGD(params[:1], lr=0.1),
        torch.optim.Adam(params[1:], lr=0.1),
    ]
    for _ in range(5):
        train(optimizers, params)
    assert hook.step_count == 5


def test_explicit_steps_replace_optimizer_steps(hook: Hook) -> None:
    params = [torch.ones(3, requires_grad=True)]
    optimizers: list[torch.optim.Optimizer] = [torch.optim.SGD(params, lr=0.1)]
    train(optimizers, params)
    train(optimizers, params)
    assert hook.step_count == 2
    for _ in range(3):
        train(optimizers, params)
        hook.explicit_step()
    assert hook.step_count == 5  # from the first explicit call on, optimizers no longer count


def test_the_next_optimizer_counts_once_the_first_is_gone(hook: Hook) -> None:
    params = [torch.ones(3, requires_grad=True)]
    first = torch.optim.SGD(params, lr=0.1)
    second = torch.optim.SGD(params, lr=0.1)
    train([first, second], params)
    train([second], params)  # not the leader: not a boundary
    assert hook.step_count == 1
    del first
    gc.collect()
    train([second], params)
    train([second], params)
    assert hook.step_count == 3


def test_first_boundary_starts_heartbeats(hook: Hook, tmp_path: Path) -> None:
    heartbeat = spool.rank_dir(tmp_path / "spool", 0) / spool.HEARTBEAT
    assert not heartbeat.exists()  # no step yet: this process is not a rank process yet
    hook.explicit_step()
    hook.explicit_step()

    deadline = time.monotonic() + 30
    value = spool.read_json(heartbeat)
    while not (isinstance(value, dict) and value.get("step") == 2):
        assert time.monotonic() < deadline, f"no heartbeat at step 2: {value}"
        time.sleep(0.02)
        value = spool.read_json(heartbeat)
    assert value["phase"] == "dormant" and value["exited"] is False
    assert isinstance(value["last_step_unix"], float)
    assert value["updated_unix"] >= value["last_step_unix"]
