"""Timings of the per-worker engine (not a test: run it by hand, numbers go in docs/engine.md).

    .venv/bin/python tests/engine/bench_engine.py [--repeat N]

1. Kineto ingest of the two largest shared HTA traces (~109k and ~105k events), each in a
   fresh process (wall time, peak RSS), next to `json.load` of the same files (the first step
   of any pure-Python reader, HTA's included).
2. Critical path + summary on ~1M events (the biggest trace repeated in time).
"""

from __future__ import annotations

import argparse
import json
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
from pathlib import Path
t = time.perf_counter()
from perfdiag.kineto import read_kineto
imported = time.perf_counter()
rows = 0
for name in sys.argv[1:]:
    events, meta = read_kineto(Path(name))
    rows += events.num_rows
done = time.perf_counter()
print(f"{done - imported:.3f} {imported - t:.3f} {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} {rows}")
"""

CHILD_JSON = """
import gzip, json, resource, sys, time
t = time.perf_counter()
n = 0
for name in sys.argv[1:]:
    with gzip.open(name) as fh:
        n += len(json.load(fh)["traceEvents"])
print(f"{time.perf_counter() - t:.3f} {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} {n}")
"""


def run(code: str, files: list[Path]) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", code, *map(str, files)], capture_output=True, text=True, check=True
    )
    return out.stdout.split()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--events", type=int, default=1_000_000)
    args = parser.parse_args()
    print(f"load average: {os.getloadavg()}, cores: {os.cpu_count()}")
    ingest = [run(CHILD_INGEST, FILES) for _ in range(args.repeat)]
    best = min(ingest, key=lambda r: float(r[0]))
    print(
        f"read_kineto, 2 ranks ({best[3]} window events): best {float(best[0]):.3f} s, "
        f"median {sorted(float(r[0]) for r in ingest)[len(ingest) // 2]:.3f} s, "
        f"peak RSS {best[2]} MB (imports {float(best[1]):.2f} s, not counted)"
    )
    baseline = [run(CHILD_JSON, FILES) for _ in range(args.repeat)]
    best_json = min(baseline, key=lambda r: float(r[0]))
    print(
        f"gzip + json.load alone, 2 ranks ({best_json[2]} events): best {float(best_json[0]):.3f} s,"
        f" peak RSS {best_json[1]} MB"
    )

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
    print(json.dumps({"ingest_s": float(best[0]), "json_load_s": float(best_json[0])}))


if __name__ == "__main__":
    main()
