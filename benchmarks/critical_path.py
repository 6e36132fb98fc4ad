"""Critical path and per-rank summary on ~1M events: the biggest shared HTA trace (control,
109k events) repeated in time.

    .venv/bin/python benchmarks/critical_path.py [--repeat 5] [--events 1000000]

(The Kineto ingest, next to HTA, is benchmarks/kineto_ingest.py.)
"""

from __future__ import annotations

import argparse
import os
import time

import pyarrow as pa
import pyarrow.compute as pc
from hta_env import SHARED_TRACES

from perfdiag.api.schema import WindowMeta, WorkerMeta
from perfdiag.engine.critical_path import critical_path
from perfdiag.engine.kineto import read_kineto
from perfdiag.engine.summary import summarize

TRACE = SHARED_TRACES / "trace_diff" / "control" / "control.json.gz"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--events", type=int, default=1_000_000)
    args = parser.parse_args()
    print(f"load average: {os.getloadavg()}, cores: {os.cpu_count()}")
    events, meta = read_kineto(TRACE)
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
