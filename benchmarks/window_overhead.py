"""Step time inside the capture window — the perfdiag hook vs plain torch.profiler with the same
settings vs no profiling — and how long the training is held when the window ends; plus the
size of what a window leaves behind (Kineto trace vs events.parquet vs summary.parquet) and the
agent's time to process it.

    .venv/bin/python benchmarks/window_overhead.py [--repeats 5] [--capture 10] [--steps 120]
        [--device cuda] [--stacks both|on|off]

Each repetition runs the three modes one after the other in fresh single-process children
(benchmarks/window_loop.py: the demo's model and DataLoader), with and without Python stacks,
so that machine noise hits all modes alike; medians over repetitions are printed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from perfdiag.local.runner import training_env

HERE = Path(__file__).resolve().parent
LOOP = HERE / "window_loop.py"


@dataclass
class Sample:
    baseline_ms: float  # median step outside the window
    window_ms: float  # median step inside it (first profiled step and the last one excluded)
    hold_ms: float  # extra time of the step in which the window ends (stop + export)


def run_child(
    mode: str, args: argparse.Namespace, python_stacks: bool, work: Path, hook_dir: Path
) -> tuple[list[int], Path]:
    spool = work / "spool"
    trace_dir = work / "trace"
    trace_dir.mkdir(parents=True, exist_ok=True)
    result = work / "result.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if mode == "hook":  # exactly what `perfdiag run` gives its ranks
        env = training_env(env, hook_dir, spool, work / "plan.json")
    argv = [
        sys.executable,
        str(LOOP),
        "--mode",
        mode,
        "--after",
        str(args.after),
        "--window-at",
        str(args.window_at),
        "--capture",
        str(args.capture),
        "--trace-dir",
        str(trace_dir),
        "--result",
        str(result),
        "--device",
        args.device,
        *(["--python-stacks"] if python_stacks else []),
    ]
    subprocess.run(argv, env=env, check=True, timeout=600, cwd=work)
    ends = json.loads(result.read_text())["ends_ns"]
    return ends, spool


def hook_window(spool: Path) -> tuple[int, int, Path]:
    """(index in ends_ns of the first profiled step's start, steps profiled, window folder)."""
    windows = list((spool / "rank-0" / "windows").iterdir())
    assert len(windows) == 1, windows
    meta = json.loads((windows[0] / "hook.json").read_text())
    if meta.get("error"):
        raise SystemExit(f"the hook's window failed: {meta['error']}")
    return int(meta["first_step"]), int(meta["steps"]) + 1, windows[0]


def sample(ends: list[int], first: int, profiled: int) -> Sample:
    """Step `i` spans ends[i]..ends[i+1] (0-based); the window profiles steps first…first+n-1,
    the stop and export land in the last of them or the next one."""
    durations = [(b - a) / 1e6 for a, b in itertools.pairwise(ends)]
    last = first + profiled - 1
    outside = durations[5 : first - 1] + durations[last + 3 :]
    inside = durations[first + 1 : last]
    hold_step = max(durations[last : last + 2])
    window_ms = statistics.median(inside)
    return Sample(statistics.median(outside), window_ms, hold_step - window_ms)


def sizes(window: Path, work: Path) -> dict[str, float]:
    """Process the hook's window with the agent; file sizes (KiB) and processing time."""
    from perfdiag.collector.agent import process_window
    from perfdiag.storage import open_storage

    storage = open_storage(work / "capture")
    started = time.perf_counter()
    status = process_window(window.parents[2], 0, window.name, storage, keep_raw=True)
    seconds = time.perf_counter() - started
    if status.phase != "done":
        raise SystemExit(f"the agent could not process the window: {status.error}")
    kib = {
        name: (work / "capture" / "workers" / "0" / name).stat().st_size / 1024
        for name in ("events.parquet", "summary.parquet")
    }
    kib["trace.json"] = (window / "trace.json").stat().st_size / 1024
    kib["process_s"] = seconds
    # The hook's own timing of its profiler start and of its stop + export (hook.json).
    hold = json.loads((window / "hook.json").read_text()).get("hold_ms") or {}
    kib["hook_start_ms"] = float(hold.get("start", float("nan")))
    kib["hook_stop_ms"] = float(hold.get("stop", float("nan")))
    return kib


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--after", type=int, default=60, help="steps run after the window")
    parser.add_argument("--window-at", type=int, default=30)
    parser.add_argument("--capture", type=int, default=10)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--stacks", choices=("both", "on", "off"), default="both")
    args = parser.parse_args()
    args.stack_modes = {"both": (True, False), "on": (True,), "off": (False,)}[args.stacks]

    from perfdiag.collector.hookdir import materialize

    results: dict[tuple[str, bool], list[Sample]] = {}
    size_runs: dict[bool, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="perfdiag-bench-") as tmp:
        hook_dir = materialize(Path(tmp) / "hook")
        for repeat in range(args.repeats):
            for stacks in args.stack_modes:
                for mode in ("none", "hook", "profiler"):
                    work = Path(tmp) / f"{repeat}-{mode}-{stacks}"
                    ends, spool = run_child(mode, args, stacks, work, hook_dir)
                    if mode == "hook":
                        first, profiled, window = hook_window(spool)
                        size_runs.setdefault(stacks, []).append(sizes(window, work))
                    else:
                        first, profiled = args.window_at, args.capture + 1
                    results.setdefault((mode, stacks), []).append(sample(ends, first, profiled))
            print(f"repeat {repeat + 1}/{args.repeats} done", file=sys.stderr)
    report(results, size_runs, args)


def report(
    results: dict[tuple[str, bool], list[Sample]],
    size_runs: dict[bool, list[dict[str, float]]],
    args: argparse.Namespace,
) -> None:
    def med(values: list[float]) -> float:
        return statistics.median(values)

    print(
        f"\nwindow of {args.capture} steps (+1 warm-up), demo model on {args.device}, 1 process, "
        f"medians of "
        f"{args.repeats} runs\n"
    )
    print(
        f"{'python stacks':<14} {'mode':<9} {'step outside':>13} {'step inside':>12} "
        f"{'inside/outside':>15} {'hold at end':>12}"
    )
    for stacks in args.stack_modes:
        for mode in ("none", "hook", "profiler"):
            samples = results[(mode, stacks)]
            base = med([s.baseline_ms for s in samples])
            inside = med([s.window_ms for s in samples])
            hold = med([s.hold_ms for s in samples])
            ratio = med([s.window_ms / s.baseline_ms for s in samples])
            hold_text = "-" if mode == "none" else f"{hold:9.0f} ms"
            print(
                f"{'on' if stacks else 'off':<14} {mode:<9} {base:10.2f} ms {inside:9.2f} ms "
                f"{ratio:14.2f}x {hold_text:>12}"
            )
    print(f"\nwindow files (KiB), agent processing time, medians of {args.repeats} runs\n")
    print(
        f"{'python stacks':<14} {'trace.json':>11} {'events.parquet':>15} "
        f"{'summary.parquet':>16} {'trace/summary':>14} {'processing':>11} "
        f"{'hook start':>11} {'hook stop':>10}"
    )
    for stacks in args.stack_modes:
        runs = size_runs[stacks]
        trace = med([r["trace.json"] for r in runs])
        events = med([r["events.parquet"] for r in runs])
        summary = med([r["summary.parquet"] for r in runs])
        seconds = med([r["process_s"] for r in runs])
        start = med([r["hook_start_ms"] for r in runs])
        stop = med([r["hook_stop_ms"] for r in runs])
        print(
            f"{'on' if stacks else 'off':<14} {trace:11.0f} {events:15.0f} {summary:16.1f} "
            f"{trace / summary:13.0f}x {seconds:10.2f} s {start:8.0f} ms {stop:7.0f} ms"
        )


if __name__ == "__main__":
    main()
