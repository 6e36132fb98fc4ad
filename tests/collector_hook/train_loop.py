"""A small deterministic training loop for the hook's subprocess tests.

Run with or without the hook; prints one JSON line with the losses (exact floats) and a
digest of the final parameters, so that runs can be compared bit for bit. Options add what a
test needs: a DataLoader (with forked workers), GC inside steps, explicit step() calls, two
optimizers, a user profiler, a broken torch.profiler, and a gate (at step G, mid-step, write
a marker file and wait for a heartbeat condition, or block in a sleep until a file appears).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import torch


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds, mid-step")
    parser.add_argument("--dataloader", action="store_true")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--gc", action="store_true", help="gc.collect() inside every step")
    parser.add_argument("--explicit", action="store_true", help="perfdiag.collector.step()")
    parser.add_argument("--two-optimizers", action="store_true")
    parser.add_argument("--user-profiler", type=Path, help="own torch.profiler, trace here")
    parser.add_argument("--break-profiler", action="store_true")
    parser.add_argument("--gate-step", type=int, default=-1)
    parser.add_argument("--gate-marker", type=Path, help="created when the gate is reached")
    parser.add_argument("--gate-heartbeat", type=Path, help="wait for this heartbeat …")
    parser.add_argument("--gate-plan", default="", help="… to name this plan …")
    parser.add_argument("--gate-phases", default="armed", help="… in one of these phases")
    parser.add_argument("--block-until", type=Path, help="at the gate, sleep until this exists")
    return parser.parse_args()


def wait_for_heartbeat(path: Path, plan_id: str, phases: set[str]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            beat = json.loads(path.read_text())
        except (OSError, ValueError):
            beat = {}
        if beat.get("plan_id") == plan_id and beat.get("phase") in phases:
            return
        time.sleep(0.02)
    print(f"gate: heartbeat {path} never showed {plan_id} in {phases}", file=sys.stderr)
    sys.exit(3)


def block_here(until: Path) -> None:
    """The blocking call a stacks plan must see through (the name is asserted)."""
    deadline = time.monotonic() + 120
    while not until.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def main() -> int:
    args = parse_args()
    if args.break_profiler:

        def broken_start(self: object) -> None:
            raise RuntimeError("torch.profiler broken for the test")

        torch.profiler.profile.start = broken_start  # type: ignore[method-assign]
    step_marker = None
    if args.explicit:
        import perfdiag.collector

        step_marker = perfdiag.collector.step

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, 1),
    )  # fmt: skip
    params = list(model.parameters())
    if args.two_optimizers:
        optimizers = [
            torch.optim.SGD(params[:2], lr=0.01, momentum=0.9),
            torch.optim.Adam(params[2:], lr=1e-3),
        ]
    else:
        optimizers = [torch.optim.SGD(params, lr=0.01, momentum=0.9)]
    inputs = torch.randn(256, 32)
    targets = inputs.sum(dim=1, keepdim=True).sin()
    if args.dataloader:
        dataset = torch.utils.data.TensorDataset(inputs, targets)
        loader = torch.utils.data.DataLoader(
            dataset,
            batch_size=16,
            shuffle=True,
            generator=torch.Generator().manual_seed(1),
            num_workers=args.workers,
        )
    batches = None
    losses: list[float] = []
    profiler = None
    if args.user_profiler is not None:
        profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        profiler.start()
    for index in range(args.steps):
        if args.dataloader:
            if batches is None:
                batches = iter(loader)
            try:
                x, y = next(batches)
            except StopIteration:
                batches = iter(loader)
                x, y = next(batches)
        else:
            x, y = inputs[(index * 16) % 256 :][:16], targets[(index * 16) % 256 :][:16]
        for optimizer in optimizers:
            optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        if index == args.gate_step:
            if args.gate_marker is not None:
                args.gate_marker.write_text(str(os.getpid()))
            if args.block_until is not None:
                block_here(args.block_until)
            if args.gate_heartbeat is not None:
                wait_for_heartbeat(
                    args.gate_heartbeat, args.gate_plan, set(args.gate_phases.split(","))
                )
        if args.step_sleep:
            time.sleep(args.step_sleep)
        loss.backward()
        for optimizer in optimizers:
            optimizer.step()
        if args.gc:
            gc.collect()
        if step_marker is not None:
            step_marker()
        losses.append(loss.item())
    user_events = None
    if profiler is not None:
        profiler.stop()
        profiler.export_chrome_trace(str(args.user_profiler))
        user_events = len(json.loads(args.user_profiler.read_text())["traceEvents"])
    digest = hashlib.sha256()
    for param in model.parameters():
        digest.update(param.detach().numpy().tobytes())
    result = {"losses": losses, "params_sha256": digest.hexdigest(), "user_events": user_events}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
