"""How long the training thread is held when a capture window ends: stopping torch.profiler and
writing the Chrome trace, by the hook's path (the Kineto result saved directly) and by the
public one (`profile.stop()` + `export_chrome_trace()`, also with the eager parsing of every event
that older torch versions do in stop()), with and without Python stacks.

    .venv/bin/python benchmarks/hook_export.py [--steps 10] [--repeats 5]

Each sample profiles steps + 1 steps of a small MLP in this process; medians are printed.
docs/hook.md records the figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from hook_dormant import make_training
from torch.autograd.profiler import record_function

from perfdiag.collector.hook.profiler import EXPORT_KINETO_SAVE, ProfilerSession


def profiled_steps(train_step: Callable[[], None], steps: int) -> None:
    for step in range(steps + 1):
        with record_function(f"ProfilerStep#{step}"):
            train_step()


def hook_path(train_step: Callable[[], None], steps: int, stacks: bool, out: Path) -> float:
    session = ProfilerSession(cuda=False, python_stacks=stacks)
    session.start()
    profiled_steps(train_step, steps)
    begun = time.perf_counter()
    assert session.stop_and_export(str(out)) == EXPORT_KINETO_SAVE
    return time.perf_counter() - begun


def public_path(
    train_step: Callable[[], None], steps: int, stacks: bool, out: Path, eager: bool = False
) -> float:
    """`profile.stop()` + `export_chrome_trace()`; `eager`: as older torch runs it, stop()
    parsing every event into Python objects (torch 2.1 parses eagerly; newer versions defer
    it, so it is forced here)."""
    profile = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], with_stack=stacks, record_shapes=False
    )
    profile.start()
    profiled_steps(train_step, steps)
    begun = time.perf_counter()
    profile.stop()
    if eager:
        assert profile.profiler is not None
        profile.profiler.function_events  # noqa: B018 - the eager parse of older torch versions
    profile.export_chrome_trace(str(out))
    return time.perf_counter() - begun


def eager_public_path(train_step: Callable[[], None], steps: int, stacks: bool, out: Path) -> float:
    return public_path(train_step, steps, stacks, out, eager=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="analysed steps (+1 warm-up)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    train_step, _ = make_training()
    for _ in range(20):
        train_step()
    print(
        f"torch {torch.__version__}: end of a window of {args.steps}+1 steps (medians of {args.repeats})"
    )
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "trace.json"
        for stacks in (False, True):
            for name, path in (
                ("hook (Kineto result .save)", hook_path),
                ("public stop+export", public_path),
                ("public, eager parse (torch 2.1)", eager_public_path),
            ):
                held = [path(train_step, args.steps, stacks, out) for _ in range(args.repeats)]
                events = len(json.loads(out.read_text())["traceEvents"])
                print(
                    f"  python_stacks={stacks!s:5} {name:32} held {1e3 * statistics.median(held):7.1f} ms"
                    f"   trace {out.stat().st_size / 1e6:5.1f} MB, {events} events"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
