"""Cross-worker analysis of many workers' summaries (docs/design.md §5).

Builds the per-worker summaries of a synthetic data-parallel job (tests/analyzer/conftest.py's
SyntheticJob: 15 rows per worker, one injected Python hotspot), then times
  memory  — `analyze_capture` + `render_report` on the concatenated table, and
  storage — writing each worker's summary.parquet + status.json to a local capture folder, then
            `perfdiag analyze FOLDER` in its own process: listing, reading every file (one
            process per core), comparing, writing verdict.json, report.html and
            timeline.json.gz.
Prints wall times, peak RSS and the load average (the machine is shared).

    python benchmarks/cross_worker.py --ranks 100000 --storage
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import pyarrow as pa

from perfdiag.analyzer.pipeline import analyze_capture
from perfdiag.analyzer.report.html import render_report
from perfdiag.api.schema import SUMMARY_SCHEMA, SUMMARY_SCHEMA_ID, WorkerMeta, with_meta
from perfdiag.api.verdict import Verdict
from perfdiag.engine.parquet_io import table_to_bytes
from perfdiag.storage import layout
from perfdiag.storage.local import LocalStorage
from tests.analyzer.conftest import Fault, SyntheticJob, capture_of, write_capture


def write_capture_fast(
    storage: LocalStorage, table: pa.Table, metas: dict[int, WorkerMeta]
) -> None:
    """conftest.write_capture's layout (plan, summary.parquet + status.json per worker), with
    the table sliced by rank instead of filtered per worker (that is quadratic at 100,000)."""
    ranks = np.asarray(table.column("rank").to_numpy())
    order = np.argsort(ranks, kind="stable")
    table = table.take(pa.array(order))
    ranks = ranks[order]
    some = min(metas)
    write_capture(storage, table.filter(pa.array(ranks == some)), {some: metas[some]})
    starts = np.searchsorted(ranks, sorted(metas))
    ends = np.searchsorted(ranks, sorted(metas), side="right")
    template = storage.get_text(layout.worker_key(some, layout.STATUS))
    for rank, start, end in zip(sorted(metas), starts, ends, strict=True):
        part = table.slice(int(start), int(end - start)).replace_schema_metadata(None)
        part = part.cast(with_meta(SUMMARY_SCHEMA, SUMMARY_SCHEMA_ID, metas[rank]))
        storage.put_bytes(layout.worker_key(rank, layout.SUMMARY), table_to_bytes(part))
        status = template.replace(f'"rank":{some},', f'"rank":{rank},').replace(
            f"workers/{some}/", f"workers/{rank}/"
        )
        storage.put_text(layout.worker_key(rank, layout.STATUS), status)


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=100_000)
    parser.add_argument("--storage", action="store_true", help="also time the storage path")
    parser.add_argument(
        "--keep", type=Path, default=None, help="capture folder to write once and reuse"
    )
    args = parser.parse_args()
    culprit = args.ranks * 2 // 3
    started = time.perf_counter()
    table, metas = SyntheticJob(
        n_ranks=args.ranks,
        seed=3,
        faults=[Fault([culprit], "train.py(57): tokenize", "python", 40.0)],
    ).build()
    print(f"built {table.num_rows:,} summary rows for {args.ranks:,} workers "
          f"in {time.perf_counter() - started:.1f} s")  # fmt: skip

    started = time.perf_counter()
    analysis = analyze_capture(capture_of(table, metas))
    html = render_report(analysis)
    elapsed = time.perf_counter() - started
    top = analysis.verdict.findings[0] if analysis.verdict.findings else None
    print(
        f"memory: analyze_capture + report for {args.ranks:,} workers in {elapsed:.1f} s; "
        f"report {len(html) / 1e6:.2f} MB; top finding {top.ranks if top else None} "
        f"(injected {culprit}); peak RSS {peak_mb():.0f} MB; load {os.getloadavg()[0]:.1f}"
    )
    if not args.storage:
        return
    with tempfile.TemporaryDirectory(prefix="perfdiag-xw-") as tmp:
        storage = LocalStorage(args.keep or Path(tmp) / "capture")
        if storage.exists(layout.PLAN):
            print(f"reusing the capture in {storage.uri}")
        else:
            started = time.perf_counter()
            write_capture_fast(storage, table, metas)
            print(f"wrote {args.ranks:,} workers' files in {time.perf_counter() - started:.1f} s")
        del analysis, html
        # In its own process, as a user runs it: this one holds the in-memory stage's objects,
        # whose garbage collection would be charged to the analysis.
        command = [sys.executable, "-m", "perfdiag.cli", "analyze", storage.uri]
        started = time.perf_counter()
        result = subprocess.run(command, capture_output=True, text=True, cwd="/")
        elapsed = time.perf_counter() - started
        lines = (result.stdout + result.stderr).splitlines()
        for line in lines:
            if ": loaded " not in line or line.endswith(f"{args.ranks}/{args.ranks} workers"):
                print("  " + line)
        if result.returncode not in (0, 1):  # 1: a finding (degraded)
            raise SystemExit(f"perfdiag analyze failed (exit {result.returncode})")
        verdict = Verdict.model_validate_json(storage.get_bytes(layout.VERDICT))
        top = verdict.findings[0] if verdict.findings else None
        child_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        print(
            f"storage: `perfdiag analyze` of {args.ranks:,} workers from a local capture in "
            f"{elapsed:.1f} s (process start and imports included); top finding "
            f"{top.ranks if top else None}; peak RSS of one process {child_mb:.0f} MB; "
            f"load {os.getloadavg()[0]:.1f}"
        )


if __name__ == "__main__":
    main()
