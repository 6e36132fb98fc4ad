"""The training loop the window benchmark runs in a child process: the demo's model and
DataLoader in one process, with each step's end time recorded.

    python window_loop.py --mode none|hook|profiler --window-at W --capture K --after A \
        [--python-stacks] [--device cuda] --result out.json

With --device cuda the model and each batch live on the GPU, plain torch.profiler records the
CUDA activity too (as the hook does where CUDA is available), and each step ends with a
synchronize so that its recorded end is when its kernels are done.

mode none      no profiling at all
mode hook      the perfdiag hook (PERFDIAG_SPOOL / PERFDIAG_PLAN / PYTHONPATH set by the caller);
               the loop writes the plan file itself at step W, as `perfdiag run` would, and
               runs until A steps after the hook has written its window
mode profiler  plain torch.profiler with the hook's settings (CPU activity, with_stack as
               asked, record_shapes off) started at the end of step W, `prof.step()` at each
               step end, stopped after K+1 steps and its trace exported to a Chrome trace
               file right there (what the hook does with its window)
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader

from perfdiag.local.demo.train import SyntheticDataset, build_model
from perfdiag.local.demo.train import parse_args as demo_args


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("none", "hook", "profiler"), required=True)
    parser.add_argument("--after", type=int, default=40, help="steps after the window")
    parser.add_argument("--window-at", type=int, default=20)
    parser.add_argument("--capture", type=int, default=10)
    parser.add_argument("--python-stacks", action="store_true")
    parser.add_argument("--trace-dir", type=Path, default=None)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--result", type=Path, required=True)
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    batch = demo_args([]).batch_size  # the demo's own batch size
    loader = DataLoader(
        SyntheticDataset(batch * 16), batch_size=batch, shuffle=True, drop_last=True
    )
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    model = build_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    profiler: torch.profiler.profile | None = None
    ends_ns = [time.perf_counter_ns()]
    step = 0
    last_step = args.window_at + args.capture + 1 + args.after
    # Where the hook writes hook.json when its window ends (hook mode; known once the plan is
    # written). Every mode checks such a path each step from the window on, with one stat: the
    # check is traced like any Python call when Python stacks are on, so all modes pay it alike.
    hook_json = Path(os.devnull, "none")
    windows = Path(os.environ.get("PERFDIAG_SPOOL", os.devnull)) / "rank-0" / "windows"
    window_seen = False
    while step < last_step:
        for inputs, labels in loader:
            if cuda:
                inputs, labels = inputs.to(device), labels.to(device)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(inputs), labels)
            loss.backward()
            optimizer.step()
            if cuda:
                torch.cuda.synchronize()
            step += 1
            if profiler is not None:
                profiler.step()
                if step == args.window_at + args.capture + 1:
                    profiler.stop()
                    profiler.export_chrome_trace(str(args.trace_dir / "trace.json"))
                    profiler = None
            if args.mode == "profiler" and step == args.window_at:
                profiler = torch.profiler.profile(
                    activities=[torch.profiler.ProfilerActivity.CPU]
                    + ([torch.profiler.ProfilerActivity.CUDA] if cuda else []),
                    with_stack=args.python_stacks,
                    record_shapes=False,
                )
                profiler.start()
            ends_ns.append(time.perf_counter_ns())
            if args.mode == "hook" and step == args.window_at:
                from perfdiag.api import Plan

                plan = Plan.new(steps=args.capture, python_stacks=args.python_stacks)
                plan.write_atomic(Path(os.environ["PERFDIAG_PLAN"]))
                hook_json = windows / plan.id / "hook.json"
            if step >= args.window_at and not window_seen:
                # The hook's window ends when it writes hook.json: run A more steps after it.
                window_seen = os.path.exists(hook_json)
                if args.mode == "hook":
                    last_step = step + args.after if window_seen else step + args.after + 1
            if step >= last_step:
                break
    args.result.write_text(json.dumps({"mode": args.mode, "ends_ns": ends_ns}))


if __name__ == "__main__":
    main()
