"""Timings of the per-worker engine (not a test: run it by hand, numbers go in docs/engine.md).

    .venv/bin/python tests/engine/bench_engine.py [--repeat N] [--hta-python PYTHON]

1. Kineto ingest of the two largest shared HTA traces (~109k and ~105k events) in a fresh
   process (wall and CPU time, peak RSS), one after the other and in two threads; next to
   HTA's own TraceAnalysis load of the same two files when --hta-python names a Python that
   has HolisticTraceAnalysis, and `json.load` of them (the first step of any pure-Python
   reader).
2. Critical path + summary on ~1M events (the biggest trace repeated in time).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HTA = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "hta"
FILES = [
    HTA / "trace_diff" / "control" / "control.json.gz",
    HTA / "trace_diff" / "test" / "test.json.gz",
]

CHILD_INGEST = """
import resource, sys, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
t = time.perf_counter()
from perfdiag.kineto import read_kineto
imported = time.perf_counter()
parallel = sys.argv[1] == "parallel"
paths = [Path(name) for name in sys.argv[2:]]
r0 = resource.getrusage(resource.RUSAGE_SELF)
if parallel:
    with ThreadPoolExecutor(len(paths)) as pool:
        results = list(pool.map(read_kineto, paths))
else:
    results = [read_kineto(path) for path in paths]
done = time.perf_counter()
r1 = resource.getrusage(resource.RUSAGE_SELF)
cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
rows = sum(events.num_rows for events, _ in results)
print(f"{done - imported:.3f} {cpu:.3f} {r1.ru_maxrss / 1024:.0f} {rows}")
"""

# HTA parses ranks in worker processes: the script must be a file with a main guard.
CHILD_HTA = """
import logging, resource, sys, time
from hta.trace_analysis import TraceAnalysis
if __name__ == "__main__":
    logging.disable(logging.WARNING)
    t = time.perf_counter()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    TraceAnalysis(trace_dir=sys.argv[1])
    done = time.perf_counter()
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = sum(b - a for a, b in [(r0.ru_utime, r1.ru_utime), (r0.ru_stime, r1.ru_stime),
                                 (c0.ru_utime, c1.ru_utime), (c0.ru_stime, c1.ru_stime)])
    print(f"{done - t:.3f} {cpu:.3f} {max(r1.ru_maxrss, c1.ru_maxrss) / 1024:.0f}")
"""

CHILD_JSON = """
import gzip, json, resource, sys, time
t = time.perf_counter()
for name in sys.argv[1:]:
    with gzip.open(name) as fh:
        json.load(fh)
print(f"{time.perf_counter() - t:.3f} {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f}")
"""


def run(code: str, *args: str, python: str = sys.executable) -> list[str]:
    out = subprocess.run([python, "-c", code, *args], capture_output=True, text=True, check=True)
    return out.stdout.split()


def run_script(script: Path, *args: str, python: str) -> list[str]:
    out = subprocess.run(
        [python, str(script), *args], capture_output=True, text=True, check=True, cwd=script.parent
    )
    return out.stdout.split()[-3:]


def best_of(label: str, runs: list[list[str]], unit: str = "events") -> float:
    best = min(runs, key=lambda r: float(r[0]))
    median = sorted(float(r[0]) for r in runs)[len(runs) // 2]
    print(
        f"{label}: best {float(best[0]):.3f} s wall (median {median:.3f}), "
        f"{float(best[1]):.3f} s CPU, peak RSS {best[2]} MB"
        + (f", {best[3]} {unit}" if len(best) > 3 else "")
    )
    return float(best[0])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument(
        "--hta-python",
        help="a Python with HolisticTraceAnalysis installed, to time its TraceAnalysis load",
    )
    args = parser.parse_args()
    print(f"load average: {os.getloadavg()}, cores: {os.cpu_count()}")
    files = [str(f) for f in FILES]
    for mode in ("sequential", "parallel"):
        runs = [run(CHILD_INGEST, mode, *files) for _ in range(args.repeat)]
        best_of(f"read_kineto, 2 ranks, {mode}", runs, "window events")
    if args.hta_python:
        import shutil
        import tempfile

        with tempfile.TemporaryDirectory() as folder:
            for rank, path in enumerate(FILES):
                shutil.copy(path, Path(folder) / f"rank-{rank}.json.gz")
            script = Path(folder) / "hta_load.py"
            script.write_text(CHILD_HTA)
            runs = [run_script(script, folder, python=args.hta_python) for _ in range(args.repeat)]
            best_of("HTA TraceAnalysis load, 2 ranks", runs)
    runs = [run(CHILD_JSON, *files) for _ in range(args.repeat)]
    best = min(runs, key=lambda r: float(r[0]))
    print(f"gzip + json.load alone, 2 ranks: best {float(best[0]):.3f} s, peak RSS {best[1]} MB")

    import pyarrow as pa
    import pyarrow.compute as pc

    from perfdiag.critical_path import critical_path
    from perfdiag.kineto import read_kineto
    from perfdiag.schema import WindowMeta, WorkerMeta
    from perfdiag.summary import summarize

    events, meta = read_kineto(FILES[0])
    bounds = meta.window.step_bounds_ns
    span = bounds[-1][1] - bounds[0][0]
    copies = max(args.events // events.num_rows, 1)
    tables = [
        events.set_column(
            events.schema.get_field_index("ts_ns"), "ts_ns", pc.add(events["ts_ns"], i * span)
        )
        for i in range(copies)
    ]
    big = pa.concat_tables(tables).combine_chunks()
    big_bounds = [(s + i * span, e + i * span) for i in range(copies) for s, e in bounds]
    big_meta = WorkerMeta(
        rank=meta.rank,
        window=WindowMeta(
            id="bench", start_step=0, steps=len(big_bounds), step_bounds_ns=big_bounds
        ),
    )
    times = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        critical_path(big, big_bounds)
        times.append(time.perf_counter() - t)
    print(f"critical_path, {big.num_rows} events, {len(big_bounds)} steps: best {min(times):.3f} s")
    times = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        summary = summarize(big, big_meta)
        times.append(time.perf_counter() - t)
    print(
        f"summarize (critical path included), {big.num_rows} events: best {min(times):.3f} s, "
        f"{summary.num_rows} rows"
    )


if __name__ == "__main__":
    main()
