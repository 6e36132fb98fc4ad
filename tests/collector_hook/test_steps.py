"""Step boundaries, in this process with real torch optimizers: what counts as one step."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch.optim import optimizer as optimizer_module

from perfdiag.collector.hook import Hook, spool


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


def test_step_times_are_the_mean_and_longest_of_the_last_n_steps(hook: Hook) -> None:
    assert hook.step_times_ms(3) is None  # no step yet
    for pause_s in (0.0, 0.002, 0.002, 0.002, 0.02):
        time.sleep(pause_s)
        hook.explicit_step()
    times = hook.step_times_ms(4)
    assert times is not None
    mean, longest = times
    # Steps 2–5 took about 2, 2, 2 and 20 ms: the mean and the longest of them.
    assert 6.0 <= mean <= 6.0 + 20 and 20.0 <= longest <= 40.0
    assert hook.step_times_ms(5) is None  # five ends make four whole steps
    assert hook.step_times_ms(0) is None


def test_the_step_ring_wraps_without_growing(hook: Hook) -> None:
    from perfdiag.collector.hook import STEP_RING

    ring = hook._step_ends
    for _ in range(STEP_RING * 2 + 5):
        hook.explicit_step()
    assert hook._step_ends is ring and len(ring) == STEP_RING
    times = hook.step_times_ms(STEP_RING - 2)
    assert times is not None and times[0] > 0 and times[1] >= times[0]


def test_a_watch_plan_sets_the_steps_of_the_heartbeats_mean(hook: Hook, tmp_path: Path) -> None:
    from perfdiag.api.plan import Plan

    Plan.new(action="watch", steps=5).write_atomic(tmp_path / "plan.json")
    for _ in range(8):
        time.sleep(0.001)
        hook.explicit_step()

    def beat() -> dict[str, object] | None:
        data = spool.read_json(spool.rank_dir(tmp_path / "spool", 0) / spool.HEARTBEAT)
        return data if isinstance(data, dict) and data.get("mean_steps") == 5 else None

    deadline = time.monotonic() + 30
    while (found := beat()) is None and time.monotonic() < deadline:
        hook.explicit_step()
        time.sleep(0.05)
    assert found is not None, "no heartbeat with the watch plan's mean"
    assert isinstance(found["mean_step_ms"], float) and found["mean_step_ms"] > 0
    assert isinstance(found["max_step_ms"], float)
    assert found["max_step_ms"] >= found["mean_step_ms"]
    assert found["phase"] == "dormant"  # watching arms nothing
