"""The per-rank ingest stage by stage: what the agent does with each window on the training
node (trace file → summary.parquet), in MB of uncompressed JSON per CPU-second.

    .venv/bin/python benchmarks/ingest_stages.py [--repeat 7] [--plain] [--json OUT] [FILE ...]

Default files: the GPT-2 traces (../shared/traces/gpu-gpt2, both pairs) and the shared HTA
traces above 1 MB gzipped. Each file is measured in one warm process (the agent is a sidecar
that lives for the job), `--repeat` times; each stage's figure is its lowest CPU time (this
thread's, `time.thread_time`: the scanner, the gunzip and Arrow's kernels run on it). Stages:

- gunzip: the file's text, piece by piece (ISA-L inflate; a plain read for plain JSON);
- scan: the C scanner over those pieces (grammar check, the complete events' columns, the
  collectives' JSON decoded), as the fast reader feeds it;
- arrow: the scanner's columns → the raw events table (RAW_SCHEMA), collective arguments in;
- events: step ranges, perfdiag's own events left out, categories, the events table
  (EVENTS_SCHEMA) and WorkerMeta;
- summary: `summarize` (its critical path included; "critical path" is that alone, measured
  apart, with the column answers it needs); summary.parquet; events.parquet (the agent writes
  it unless `--no-keep-raw`).

"total" is `read_kineto` + `summarize` + summary.parquet timed as one call (what the stages add
up to, give or take); "agent" is `collector.agent.process_window` on a spool window holding the
trace as the hook writes it (plain JSON; events.parquet and summary.parquet into a local folder).
`--plain` measures every stage on the gunzipped text written to a temporary file (the agent's
input), not on the .json.gz. To compare with another version of the engine that has the same
stage functions (`read_pieces`, `parse.raw_trace`, `trace_events`), run the script with
`PYTHONPATH` at an export of it (docs/benchmarks.md, "Kineto ingest, stage by stage").
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"


def default_files() -> list[Path]:
    gpt2 = sorted((TRACES / "gpu-gpt2").glob("*/*.json.gz"))
    hta = [p for p in sorted((TRACES / "hta").rglob("*.json.gz")) if p.stat().st_size > 1 << 20]
    return gpt2 + hta


def _cpu(work: Callable[[], Any]) -> tuple[float, Any]:
    start = time.thread_time()
    result = work()
    return time.thread_time() - start, result


def stages_once(path: Path) -> dict[str, float]:
    """One pass over the stages; CPU seconds of each."""
    from perfdiag.api.taxonomy import same_columns
    from perfdiag.engine.allocator import system_allocator
    from perfdiag.engine.critical_path import critical_path
    from perfdiag.engine.kineto import parse, trace_events
    from perfdiag.engine.kineto.fast_reader import read_pieces
    from perfdiag.engine.kineto.text import PIECE, pieces
    from perfdiag.engine.parquet_io import table_to_bytes
    from perfdiag.engine.summary import summarize

    out: dict[str, float] = {}
    with system_allocator(), same_columns():
        out["gunzip"], texts = _cpu(lambda: list(pieces(path, PIECE)))
        out["scan"], read = _cpu(partial(read_pieces, iter(texts), parse.COMM_CALL_PREFIXES))
        texts.clear()
        out["arrow"], raw = _cpu(partial(parse.raw_trace, path, read))
        read = None
        out["events"], (events, meta) = _cpu(partial(trace_events, raw))
        raw = None
        out["summary"], summary = _cpu(partial(summarize, events, meta))
        out["summary.parquet"], _ = _cpu(partial(table_to_bytes, summary))
        out["events.parquet"], _ = _cpu(partial(table_to_bytes, events))
    with system_allocator(), same_columns():  # its own: the summary's answers not kept
        out["critical path"], _ = _cpu(partial(critical_path, events, meta.window.step_bounds_ns))
    return out


def total_once(path: Path) -> float:
    from perfdiag.api.taxonomy import same_columns
    from perfdiag.engine.kineto import read_kineto
    from perfdiag.engine.parquet_io import table_to_bytes
    from perfdiag.engine.summary import summarize

    def work() -> int:
        with same_columns():
            events, meta = read_kineto(path)
            return len(table_to_bytes(summarize(events, meta)))

    return _cpu(work)[0]


def agent_setup(path: Path, tmp: Path) -> Callable[[], Any]:
    """A spool window holding `path` as the hook writes it; the call that processes it."""
    from perfdiag.collector.agent import process_window
    from perfdiag.collector.hook import spool
    from perfdiag.engine.kineto import load_trace, profiler_steps
    from perfdiag.storage import open_storage

    steps = profiler_steps(load_trace(path))
    folder = spool.window_dir(tmp / "spool", 0, "plan")
    folder.mkdir(parents=True)
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as src, (folder / spool.TRACE).open("wb") as dst:
        shutil.copyfileobj(src, dst)
    first = steps[0].number if steps else 0
    hook = {"first_step": first, "steps": max(len(steps) - 1, 1), "pid": 1, "host": "h"}
    (folder / spool.HOOK_META).write_text(json.dumps(hook))
    storage = open_storage(str(tmp / "store"))
    return lambda: process_window(tmp / "spool", 0, "plan", storage)


def measure(path: Path, repeat: int, label: str) -> dict[str, Any]:
    size = _json_bytes(path)
    first = stages_once(path)
    runs = [stages_once(path) for _ in range(repeat)]
    best = {stage: min(r[stage] for r in runs) for stage in runs[0]}
    totals = [total_once(path) for _ in range(repeat)]
    with tempfile.TemporaryDirectory(prefix="perfdiag-stages-") as name:
        agent = agent_setup(path, Path(name))
        agent_cpu = min(_cpu(agent)[0] for _ in range(repeat))
    return {
        "file": label,
        "json_mb": size / 1e6,
        "first": first,
        "best": best,
        "total": min(totals),
        "agent": agent_cpu,
    }


def _json_bytes(path: Path) -> int:
    if not path.name.endswith(".gz"):
        return path.stat().st_size
    total = 0
    with gzip.open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            total += len(chunk)
    return total


def print_result(result: dict[str, Any]) -> None:
    mb = result["json_mb"]
    best = result["best"]
    print(f"{result['file']}: {mb:.1f} MB of JSON")
    for stage, cpu in best.items():
        rate = f"{mb / cpu:8.0f} MB/s" if cpu > 0 else "       - MB/s"
        print(f"  {stage:16s} {cpu * 1e3:7.1f} ms  {rate}")
    to_summary = sum(v for k, v in best.items() if k not in ("events.parquet", "critical path"))
    print(f"  {'sum to summary':16s} {to_summary * 1e3:7.1f} ms  {mb / to_summary:8.0f} MB/s")
    print(
        f"  {'total (1 call)':16s} {result['total'] * 1e3:7.1f} ms  {mb / result['total']:8.0f} MB/s"
    )
    print(
        f"  {'agent window':16s} {result['agent'] * 1e3:7.1f} ms  {mb / result['agent']:8.0f} MB/s"
        "  (plain trace.json → events.parquet + summary.parquet)"
    )
    first = sum(v for k, v in result["first"].items() if k != "critical path")  # in summary
    print(f"  first pass in the process: {first * 1e3:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--plain", action="store_true", help="measure on the gunzipped text")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    # No OpenBLAS thread pool, as `perfdiag analyze` sets it (perfdiag/cli).
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    # Imported by pyarrow on first use: before the clock, as in a process that has read a trace.
    import dateutil.relativedelta  # type: ignore[import-untyped]  # noqa: F401
    import numpy.ma  # noqa: F401

    files = args.files or default_files()
    print(
        f"load average {os.getloadavg()}, {os.cpu_count()} cores, Python {sys.version.split()[0]}"
    )
    results = []
    with tempfile.TemporaryDirectory(prefix="perfdiag-plain-") as name:
        for path in files:
            label = str(path.relative_to(TRACES)) if TRACES in path.parents else str(path)
            if args.plain and path.name.endswith(".gz"):
                plain = Path(name) / path.name.removesuffix(".gz")
                with gzip.open(path, "rb") as src, plain.open("wb") as dst:
                    shutil.copyfileobj(src, dst)
                path = plain
            result = measure(path, args.repeat, label + (" (gunzipped)" if args.plain else ""))
            print_result(result)
            results.append(result)
    print(f"load average {os.getloadavg()}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
