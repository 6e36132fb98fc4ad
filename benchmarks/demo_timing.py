"""Where the time of a `perfdiag demo` run goes, and what its window costs on the real 4-rank
job: the progress lines are time-stamped as they arrive; each rank's hook.json gives how long
the hook held the training to start and to end the window; the files give the sizes of the raw
trace, events.parquet and summary.parquet. Medians over runs (and over ranks).

    .venv/bin/python benchmarks/demo_timing.py [--runs 3] [--scenario healthy]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# (phase name, the progress line that ends it)
MILESTONES = (
    ("start: torchrun, 4 ranks import torch, gloo rendezvous", "waiting for 4 ranks to reach"),
    ("warm-up steps, until the plan is written", "or later: capturing"),
    ("window: plan pick-up, profiled steps, trace export", "processing rank"),
    ("processing the ranks' windows (agent)", "analyzing"),
    ("analysis: verdict.json and report.html", "wrote "),
    ("end of training after the verdict", None),
)


def one_run(scenario: str) -> tuple[list[float], dict[str, float]]:
    with tempfile.TemporaryDirectory(prefix="perfdiag-timing-") as tmp:
        out, spool = Path(tmp) / "out", Path(tmp) / "spool"
        started = time.monotonic()
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "perfdiag.cli",
                "demo",
                scenario,
                "--out",
                str(out),
                "--spool",
                str(spool),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp,
        )
        assert process.stderr is not None
        marks: list[float] = []
        pending = [needle for _, needle in MILESTONES if needle]
        lines = []
        for line in process.stderr:
            lines.append(line)
            if pending and line.startswith("perfdiag: ") and pending[0] in line:
                marks.append(time.monotonic())
                pending.pop(0)
        if process.wait() != 0 or pending:
            tail = "".join(lines[-15:])
            raise SystemExit(f"the demo failed (exit {process.returncode}):\n{tail}")
        marks.append(time.monotonic())
        return [b - a for a, b in itertools.pairwise([started, *marks])], window_costs(out, spool)


def window_costs(out: Path, spool: Path) -> dict[str, float]:
    holds_start, holds_stop, trace, events, summary = [], [], [], [], []
    for meta_file in spool.glob("rank-*/windows/*/hook.json"):
        meta = json.loads(meta_file.read_text())
        holds_start.append(meta["hold_ms"]["start"])
        holds_stop.append(meta["hold_ms"]["stop"])
        trace.append((meta_file.parent / "trace.json").stat().st_size / 1024)
    for worker in (out / "workers").iterdir():
        events.append((worker / "events.parquet").stat().st_size / 1024)
        summary.append((worker / "summary.parquet").stat().st_size / 1024)
    return {
        "hold to start, ms": statistics.median(holds_start),
        "hold to end, ms": statistics.median(holds_stop),
        "trace.json, KiB": statistics.median(trace),
        "events.parquet, KiB": statistics.median(events),
        "summary.parquet, KiB": statistics.median(summary),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--scenario", default="healthy")
    args = parser.parse_args()
    runs = [one_run(args.scenario) for _ in range(args.runs)]
    print(f"\nperfdiag demo {args.scenario}: seconds per phase, median of {args.runs} runs\n")
    for index, (name, _) in enumerate(MILESTONES):
        print(f"{statistics.median(r[0][index] for r in runs):7.1f} s  {name}")
    print(f"{statistics.median(sum(r[0]) for r in runs):7.1f} s  total")
    print("\nthe window (10 + 1 steps, Python stacks on), median over ranks and runs\n")
    for key in runs[0][1]:
        print(f"{statistics.median(r[1][key] for r in runs):9.1f}  {key}")


if __name__ == "__main__":
    main()
