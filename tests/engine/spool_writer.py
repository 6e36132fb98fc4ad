"""Writes a real spool window the way the hook does (collector/hook/spool.py), from a small training
loop profiled with torch.profiler. Run as a script (one process, or under torchrun with gloo).

    python spool_writer.py SPOOL --plan-id ID [--first-step N] [--steps K] [--slow-rank R]
        [--slow-kind python|aten] [--stacks] [--shapes] [--gc-step N]

Each profiled step n is a "ProfilerStep#n" range; hook.json carries the step marks (the
perf_counter_ns at which each step began), the GC pauses seen by gc.callbacks and the rest of
the contract. --slow-rank makes one rank do extra work every step (Python or aten), the
culprit of a straggler scenario.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("spool", type=Path)
    parser.add_argument("--plan-id", required=True)
    parser.add_argument("--first-step", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--slow-kind", choices=["python", "aten"], default="python")
    parser.add_argument("--slow-ms", type=float, default=30.0)
    parser.add_argument("--stacks", action="store_true")
    parser.add_argument("--shapes", action="store_true", help="record_shapes=True")
    parser.add_argument("--gc-step", type=int, default=-1)
    args = parser.parse_args()

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.profiler import ProfilerActivity, profile, record_function
    from torch.utils.data import DataLoader, TensorDataset

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model: nn.Module = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 10))
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(4096, 128), torch.randint(0, 10, (4096,)))
    loader = iter(DataLoader(data, batch_size=64))

    rank_dir = args.spool / f"rank-{rank}"
    window = rank_dir / "windows" / args.plan_id
    window.mkdir(parents=True, exist_ok=True)
    gc_records: list[dict[str, int]] = []
    gc_start: dict[str, int] = {}

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_start["t"] = time.perf_counter_ns()
        elif "t" in gc_start:
            gc_records.append(
                {
                    "start_ns": gc_start.pop("t"),
                    "end_ns": time.perf_counter_ns(),
                    "generation": info["generation"],
                    "collected": info["collected"],
                }
            )

    def train_step(step: int) -> None:
        x, y = next(loader)
        loss = nn.functional.cross_entropy(model(x), y)
        if rank == args.slow_rank:
            extra_work(args.slow_kind, args.slow_ms, torch)
        if step == args.gc_step:
            gc.collect()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    step = 0
    while step < args.first_step:  # uncaptured steps before the window
        train_step(step)
        step += 1
    marks: list[dict[str, int]] = []
    gc.callbacks.append(on_gc)
    prof = profile(
        activities=[ProfilerActivity.CPU], with_stack=args.stacks, record_shapes=args.shapes
    )
    prof.start()
    for _ in range(args.steps + 1):  # warm-up step, then the analysed steps
        marks.append({"step": step, "clock_ns": time.perf_counter_ns()})
        with record_function(f"ProfilerStep#{step}"):
            train_step(step)
        step += 1
    marks.append({"step": step, "clock_ns": time.perf_counter_ns()})
    prof.stop()
    gc.callbacks.remove(on_gc)
    prof.export_chrome_trace(str(window / "trace.json"))
    hook = {
        "rank": rank,
        "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
        "world_size": world,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "torch_version": torch.__version__,
        "plan": {"id": args.plan_id, "action": "capture", "steps": args.steps},
        "first_step": args.first_step,
        "steps": args.steps,
        "python_stacks": args.stacks,
        "has_cuda": False,
        "clock": "perf_counter_ns",
        "step_marks": marks,
        "gc": gc_records,
        "error": None,
    }
    (window / "hook.json").write_text(json.dumps(hook))
    beat = {
        "rank": rank,
        "local_rank": hook["local_rank"],
        "world_size": world,
        "pid": os.getpid(),
        "host": hook["host"],
        "step": step,
        "last_step_unix": time.time(),
        "updated_unix": time.time(),
        "phase": "dormant",
        "plan_id": args.plan_id,
        "error": None,
    }
    (rank_dir / "heartbeat.json").write_text(json.dumps(beat))
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


def extra_work(kind: str, ms: float, torch: object) -> None:
    """The culprit's extra work: a pure-Python loop, or aten matmuls."""
    deadline = time.perf_counter() + ms / 1000
    if kind == "python":
        total = 0
        while time.perf_counter() < deadline:
            for i in range(1000):
                total += i * i
        return
    import torch as t

    a = t.randn(256, 256)
    while time.perf_counter() < deadline:
        a = t.tanh(a @ a)


if __name__ == "__main__":
    main()
