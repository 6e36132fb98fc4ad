"""What the agent's hardware sampler achieves, per metric, and what it costs (docs/hardware.md
and docs/benchmarks.md record the figures).

    .venv/bin/python benchmarks/hardware_sampler.py               # ~30 s
    .venv/bin/python benchmarks/hardware_sampler.py --seconds 5 --load

For --seconds, the sampler runs (a) with the rest of its process idle, as in a sidecar between
windows' processing, and (b) with its process busy in Python on another thread (the agent
parsing a window: the GIL is contended), each with a CPU-bound child process as the sampled
"rank". Printed: achieved samples per second per metric (median over devices), the sampler
thread's CPU use, and the time the window's samples take to parse and to write as Parquet.
With --load, N CPU-bound processes (N = cores) compete for the machine too.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import resource
import threading
import time
from typing import Any

from perfdiag.api.schema import WindowMeta, WorkerMeta
from perfdiag.collector.hardware import (
    FAST_S,
    HardwareSampler,
    achieved_rates,
    hardware_table,
    worker_series,
)
from perfdiag.engine.parquet_io import table_to_bytes


def spin(stop: Any) -> None:
    x = 0
    while not stop.is_set():
        x += 1


def busy_python(stop: threading.Event) -> None:
    data = list(range(10_000))
    while not stop.is_set():
        sorted(data, key=lambda v: -v)


def measure(seconds: float, busy: bool, pid: int) -> dict[str, Any]:
    sampler = HardwareSampler(pids={0: pid})
    stop = threading.Event()
    worker = threading.Thread(target=busy_python, args=(stop,), daemon=True)
    usage0 = resource.getrusage(resource.RUSAGE_SELF)
    if busy:
        worker.start()
    sampler.start()
    time.sleep(seconds)
    sampler.stop()
    stop.set()
    if busy:
        worker.join()
    usage1 = resource.getrusage(resource.RUSAGE_SELF)
    parse_started = time.perf_counter()
    series = sampler.samples()
    parse_s = time.perf_counter() - parse_started
    meta = WorkerMeta(
        rank=0, window=WindowMeta(id="bench", start_step=0, steps=1, step_bounds_ns=[(0, 1)])
    )
    write_started = time.perf_counter()
    table = hardware_table(worker_series(series, 0, 0), meta)
    blob = table_to_bytes(table)
    write_s = time.perf_counter() - write_started
    cpu = (usage1.ru_utime + usage1.ru_stime) - (usage0.ru_utime + usage0.ru_stime)
    return {
        "rates": achieved_rates(series),
        "process_cpu_per_s": cpu / seconds,
        "rows": table.num_rows,
        "parquet_bytes": len(blob),
        "parse_s": parse_s,
        "write_s": write_s,
        "notes": sampler.notes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--load", action="store_true", help="add one CPU hog per core")
    args = parser.parse_args()

    # Warm the Parquet writer up so the first measurement does not include its import.
    table_to_bytes(
        hardware_table(
            [],
            WorkerMeta(
                rank=0, window=WindowMeta(id="w", start_step=0, steps=1, step_bounds_ns=[(0, 1)])
            ),
        )
    )
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    rank = ctx.Process(target=spin, args=(stop,), daemon=True)
    rank.start()
    hogs = [ctx.Process(target=spin, args=(stop,), daemon=True) for _ in range(os.cpu_count() or 1)]
    if args.load:
        for hog in hogs:
            hog.start()
    print(
        f"machine: {os.cpu_count()} cores, {platform.python_implementation()} "
        f"{platform.python_version()}, load average {os.getloadavg()[0]:.1f} at start; "
        f"fast tier period {FAST_S * 1000:.0f} ms; window {args.seconds:.0f} s"
        + ("; + one CPU hog per core" if args.load else "")
    )
    results = {}
    for label, busy in (("agent idle", False), ("agent busy in Python", True)):
        results[label] = measure(args.seconds, busy, rank.pid or 0)
    stop.set()
    metrics = sorted({m for r in results.values() for m in r["rates"]})
    labels = list(results)
    print(f"\n{'metric':28s}" + "".join(f"{label:>24s}" for label in labels))
    for metric in metrics:
        row = "".join(
            f"{results[label]['rates'].get(metric, float('nan')):>20.0f} /s " for label in labels
        )
        print(f"{metric:28s}{row}")
    for label in labels:
        r = results[label]
        print(
            f"\n{label}: process CPU {r['process_cpu_per_s'] * 100:.1f}% of a core "
            f"(sampler + {'busy thread' if 'busy' in label else 'nothing else'}); "
            f"{r['rows']} rows, Parquet {r['parquet_bytes'] / 1e6:.2f} MB; parse "
            f"{r['parse_s'] * 1000:.0f} ms, table + Parquet {r['write_s'] * 1000:.0f} ms"
        )
    notes = sorted({n for r in results.values() for n in r["notes"]})
    for note in notes:
        print(f"note: {note}")
    print(f"load average at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
