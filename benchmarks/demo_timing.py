"""Where the time of a `perfdiag demo` run goes: its progress lines are time-stamped as they
arrive and the phases between them are printed (medians over runs).

    .venv/bin/python benchmarks/demo_timing.py [--runs 3] [--scenario healthy]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import subprocess
import sys
import tempfile
import time

# (phase name, the progress line that ends it)
MILESTONES = (
    ("start: torchrun, 4 ranks import torch, gloo rendezvous", "waiting for 4 ranks to reach"),
    ("warm-up steps, until the plan is written", "or later: capturing"),
    ("window: plan pick-up, profiled steps, trace export", "processing rank"),
    ("processing the ranks' windows (agent)", "analyzing"),
    ("analysis: verdict.json and report.html", "wrote "),
    ("end of training after the verdict", None),
)


def one_run(scenario: str) -> list[float]:
    with tempfile.TemporaryDirectory(prefix="perfdiag-timing-") as tmp:
        started = time.monotonic()
        process = subprocess.Popen(
            [sys.executable, "-m", "perfdiag.cli", "demo", scenario, "--out", f"{tmp}/out"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp,
        )
        assert process.stderr is not None
        marks: list[float] = []
        pending = [needle for _, needle in MILESTONES if needle]
        for line in process.stderr:
            if pending and line.startswith("perfdiag: ") and pending[0] in line:
                marks.append(time.monotonic())
                pending.pop(0)
        if process.wait() != 0 or pending:
            raise SystemExit(f"the demo failed or printed no {pending[:1]} line")
        marks.append(time.monotonic())
    points = [started, *marks]
    return [b - a for a, b in itertools.pairwise(points)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--scenario", default="healthy")
    args = parser.parse_args()
    runs = [one_run(args.scenario) for _ in range(args.runs)]
    print(f"\nperfdiag demo {args.scenario}: seconds per phase, median of {args.runs} runs\n")
    for index, (name, _) in enumerate(MILESTONES):
        print(f"{statistics.median(r[index] for r in runs):7.1f} s  {name}")
    print(f"{statistics.median(sum(r) for r in runs):7.1f} s  total")


if __name__ == "__main__":
    main()
