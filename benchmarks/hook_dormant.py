"""What the dormant hook costs a training step (docs/hook.md records the figures).

    .venv/bin/python benchmarks/hook_dormant.py            # about two minutes
    .venv/bin/python benchmarks/hook_dormant.py --quick    # a rough look in ~20 s
    .venv/bin/python benchmarks/hook_dormant.py --device cuda   # the model on the GPU

1. The per-step cost of the dormant step hook, in ns: torch's global optimizer post hook and the
   explicit perfdiag.collector.step(), each minus an empty function with the same signature.
2. The step time (CPU time of the training thread, torch on one thread) of a small model with
   and without the hook, in alternating blocks (the order within each pair is random), with a
   95% confidence interval of the paired difference.
3. The CPU time of the hook's daemon thread (plan polls and heartbeats), per second.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.optim import optimizer as optimizer_module

from perfdiag.collector.hook import Hook, identity_from_env


def per_call_ns(call: Callable[[], None], calls: int, repeats: int) -> float:
    """Median over `repeats` of the mean CPU time of one call (this thread), in ns."""
    samples = []
    for _ in range(repeats):
        begun = time.thread_time_ns()
        for _ in range(calls):
            call()
        samples.append((time.thread_time_ns() - begun) / calls)
    return statistics.median(samples)


def dormant_call_costs(
    hook: Hook, optimizer: torch.optim.Optimizer, calls: int, repeats: int
) -> dict[str, float]:
    no_args: tuple[Any, ...] = ()
    no_kwargs: dict[str, Any] = {}

    def empty_post_hook(opt: Any, args: Any, kwargs: Any) -> None:
        return None

    def empty_step() -> None:
        return None

    baseline_hook = per_call_ns(
        lambda: empty_post_hook(optimizer, no_args, no_kwargs), calls, repeats
    )
    hook_call = per_call_ns(
        lambda: hook.optimizer_step(optimizer, no_args, no_kwargs), calls, repeats
    )
    # perfdiag.collector.step() as a training loop calls it, with this hook installed.
    import perfdiag.collector as collector
    from perfdiag.collector import hook as hook_module

    hook_module._hook = hook
    baseline_step = per_call_ns(empty_step, calls, repeats)
    explicit = per_call_ns(collector.step, calls, repeats)
    hook_module._hook = None
    hook._explicit = False  # optimizer steps count again for the step-time measurement
    return {
        "optimizer_hook_ns": hook_call - baseline_hook,
        "explicit_step_ns": explicit - baseline_step,
    }


def make_training(
    threads: int | None = None, device: str = "cpu"
) -> tuple[Callable[[], None], torch.optim.Optimizer]:
    """A small MLP's training step (SGD, batch 32) and its optimizer; `threads`: torch's
    intra-op threads (None: as they are). benchmarks/hook_export.py trains the same model.
    On cuda each step ends with a synchronize, so that a step is its kernels' time too."""
    torch.manual_seed(0)
    if threads is not None:
        torch.set_num_threads(threads)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 10),
    ).to(device)  # fmt: skip
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    inputs = torch.randn(32, 256, device=device)
    targets = torch.randint(0, 10, (32,), device=device)
    cuda = torch.device(device).type == "cuda"

    def train_step() -> None:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(inputs), targets).backward()
        optimizer.step()
        if cuda:
            torch.cuda.synchronize()

    return train_step, optimizer


def block_ms(train_step: Callable[[], None], steps: int, wall: bool = False) -> float:
    """CPU time of the training thread per step: unlike wall time, it does not count the time
    the thread waits for a CPU, which dominates the noise on a shared machine. `wall`: wall
    time instead, for a model on the GPU (its step is the kernels' time, not the thread's)."""
    clock = time.perf_counter_ns if wall else time.thread_time_ns
    begun = clock()
    for _ in range(steps):
        train_step()
    return (clock() - begun) / steps / 1e6


def thread_cpu_s(native_id: int) -> float:
    """CPU time of one thread of this process, from the scheduler's ns counter (Linux /proc)."""
    return int(Path(f"/proc/self/task/{native_id}/schedstat").read_text().split()[0]) / 1e9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=300, help="alternating block pairs")
    parser.add_argument("--steps-per-block", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--quick", action="store_true", help="fewer pairs and calls")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()
    pairs = 40 if args.quick else args.pairs
    calls, repeats = (20_000, 5) if args.quick else (200_000, 15)

    with tempfile.TemporaryDirectory() as tmp:
        hook = Hook(Path(tmp) / "spool", Path(tmp) / "plan.json", identity_from_env())
        train_step, optimizer = make_training(args.threads, args.device)
        # The first boundary makes the training's optimizer the counted one and starts the
        # daemon thread, as in a training process.
        hook.optimizer_step(optimizer, (), {})
        daemon = hook._thread
        assert daemon is not None and daemon.native_id is not None
        cpu_before, wall_before = thread_cpu_s(daemon.native_id), time.monotonic()

        costs = dormant_call_costs(hook, optimizer, calls, repeats)
        for _ in range(50):
            train_step()  # warm-up
        with_hook: list[float] = []
        without: list[float] = []
        for _ in range(pairs):
            order = [True, False]
            random.shuffle(order)
            for hooked in order:
                handle = (
                    optimizer_module.register_optimizer_step_post_hook(hook.optimizer_step)
                    if hooked
                    else None
                )
                (with_hook if hooked else without).append(
                    block_ms(train_step, args.steps_per_block, wall=args.device == "cuda")
                )
                if handle is not None:
                    handle.remove()
        daemon_cpu = thread_cpu_s(daemon.native_id) - cpu_before
        daemon_wall = time.monotonic() - wall_before
        hook.close()

    diffs = [a - b for a, b in zip(with_hook, without, strict=True)]
    base = statistics.mean(without)
    mean_diff = statistics.mean(diffs)
    half_width = 1.96 * statistics.stdev(diffs) / len(diffs) ** 0.5
    median_diff = statistics.median(diffs)
    print(
        f"perfdiag dormant hook: torch {torch.__version__}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, torch threads {args.threads}, model on {args.device}"
    )
    print(f"  optimizer post hook, dormant:      {costs['optimizer_hook_ns']:7.0f} ns per step")
    print(f"  perfdiag.collector.step(), dormant:{costs['explicit_step_ns']:7.0f} ns per step")
    print(
        f"  training step (MLP 256-256-256-10, batch 32, SGD), {pairs} alternating block pairs "
        f"of {args.steps_per_block} steps:"
    )
    print(f"    without hook {base:.4f} ms, with hook {statistics.mean(with_hook):.4f} ms")
    print(
        f"    difference {100 * mean_diff / base:+.3f}% "
        f"(95% CI {100 * (mean_diff - half_width) / base:+.3f}% … "
        f"{100 * (mean_diff + half_width) / base:+.3f}%)"
    )
    print(f"    median paired difference {100 * median_diff / base:+.3f}%")
    print(f"    hook call share of a step: {100 * costs['optimizer_hook_ns'] / (base * 1e6):.4f}%")
    print(
        f"  daemon thread CPU: {1e6 * daemon_cpu / daemon_wall:.0f} µs per second "
        f"({100 * daemon_cpu / daemon_wall:.4f}% of a core)"
    )
    print(f"  machine load average at the end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
