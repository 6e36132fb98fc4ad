"""The analysis's time and peak memory as the capture grows (docs/benchmarks.md, "Analyzer scale").

Two curves, each point a fresh process (imports and start included, nothing cached in memory
from the point before):

- vs the number of workers: `benchmarks/cross_worker.py --ranks N --keep DIR/N` (N workers'
  summary.parquet + status.json in a local folder, written once and reused, then
  `perfdiag analyze` on it as a child process): its wall time and the peak RSS of its process
  tree;
- vs the trace size per rank: `benchmarks/raw_ranks.py --ranks R --steps S` (R ranks of
  synthetic Kineto traces of S steps each, ~350 events a step): the analysis's wall time and
  the peak RSS of that process (the traces' generation included).

The table goes to `--out` as Markdown (and JSON beside it), with the load average before and
after each point: the machine may be shared.

    python benchmarks/scale_curves.py --workers 1000 10000 100000 --steps 4 16 64 --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORKERS_LINE = re.compile(
    r"`perfdiag analyze` of (?P<n>[\d,]+) workers: wall (?P<wall>[\d.]+) s, CPU "
    r"(?P<user>[\d.]+) s user \+ (?P<system>[\d.]+) s system.*?peak RSS (?P<rss>[\d.]+) GB"
)
RAW_LINE = re.compile(
    r"analyzed (?P<n>\d+) ranks × (?P<steps>\d+) steps in (?P<wall>[\d.]+) s .*?peak RSS "
    r"(?P<rss>\d+) MB"
)
RAW_SIZE = re.compile(r"generated \d+ traces \((?P<mb>[\d.]+) MB gz\)")


@dataclass(frozen=True)
class Point:
    curve: str
    """"workers" or "trace steps"."""
    x: int
    """Workers, or steps per rank's trace."""
    wall_s: float
    peak_rss_gb: float
    load_before: float
    load_after: float
    note: str = ""


def run(command: list[str], timeout_s: float) -> str:
    print("$ " + " ".join(command), flush=True)
    done = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=timeout_s, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"{command} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout


def workers_point(n: int, keep: Path, timeout_s: float) -> Point:
    load = os.getloadavg()[0]
    out = run(
        [sys.executable, "benchmarks/cross_worker.py", "--ranks", str(n), "--keep", str(keep)],
        timeout_s,
    )
    found = WORKERS_LINE.search(out)
    if found is None:
        raise SystemExit(f"no result line in cross_worker.py's output:\n{out}")
    return Point(
        "workers",
        n,
        float(found["wall"]),
        float(found["rss"]),
        load,
        os.getloadavg()[0],
        f"CPU {found['user']} s user + {found['system']} s system",
    )


def steps_point(ranks: int, steps: int, timeout_s: float) -> Point:
    load = os.getloadavg()[0]
    out = run(
        [sys.executable, "benchmarks/raw_ranks.py", "--ranks", str(ranks), "--steps", str(steps)],
        timeout_s,
    )
    found, size = RAW_LINE.search(out), RAW_SIZE.search(out)
    if found is None or size is None:
        raise SystemExit(f"no result line in raw_ranks.py's output:\n{out}")
    return Point(
        "trace steps",
        steps,
        float(found["wall"]),
        float(found["rss"]) / 1024,
        load,
        os.getloadavg()[0],
        f"{ranks} ranks, {float(size['mb']) / ranks:.2f} MB gz a rank",
    )


def table(points: list[Point]) -> str:
    lines = [
        "| curve | x | wall (s) | peak RSS (GB) | load before → after | note |",
        "|---|---|---|---|---|---|",
    ]
    for p in points:
        lines.append(
            f"| {p.curve} | {p.x:,} | {p.wall_s:.1f} | {p.peak_rss_gb:.2f} | "
            f"{p.load_before:.1f} → {p.load_after:.1f} | {p.note} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="*", default=[1_000, 10_000, 100_000])
    parser.add_argument("--keep", type=Path, default=Path("/tmp/perfdiag-scale"))
    parser.add_argument("--steps", type=int, nargs="*", default=[4, 16, 64])
    parser.add_argument("--ranks", type=int, default=64, help="ranks of the trace-size curve")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per point")
    parser.add_argument("--out", type=Path, default=Path("/tmp/perfdiag-scale-curves"))
    args = parser.parse_args()
    points: list[Point] = []
    started = time.perf_counter()
    for n in args.workers:
        points.append(workers_point(n, args.keep / str(n), args.timeout))
        print(table(points[-1:]), flush=True)
    for steps in args.steps:
        points.append(steps_point(args.ranks, steps, args.timeout))
        print(table(points[-1:]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "curves.md").write_text(table(points))
    (args.out / "curves.json").write_text(json.dumps([asdict(p) for p in points], indent=1))
    print(table(points))
    print(f"{len(points)} points in {time.perf_counter() - started:.0f} s; wrote {args.out}")


if __name__ == "__main__":
    main()
