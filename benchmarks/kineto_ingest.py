"""Kineto ingest, perfdiag next to HTA, on the same files in one run: wall time, CPU time and
peak memory.

    .venv/bin/python benchmarks/kineto_ingest.py [--repeat 5] [--hta-python PYTHON] [--no-hta]
        [FILE ...]

Default files: the two largest shared HTA traces (trace_diff control + test, 109k + 105k
events, 35 + 33 MB of JSON, gzipped). Each measurement runs in a fresh process:

- `perfdiag read_kineto`: read_kineto of each file, one after the other (what the agent does
  per window) and, separately, in one thread per file;
- `perfdiag read_kineto + summarize`: the same plus the per-rank summary (critical path
  included) — what `perfdiag analyze` does per trace before the cross-rank stage;
- `HTA TraceAnalysis`: HolisticTraceAnalysis 0.5.0 loading a folder with the same files (its
  default: one forked parser process per rank), in its own Python (hta_env.py).

Memory is measured three ways, each the lowest over the repetitions: the largest max RSS of
any one process of the run (what `getrusage` says; HTA's parser processes are separate, so this
undercounts it); the peak of the summed PSS (proportional set size: shared pages divided among
the processes sharing them) of the whole process tree, sampled every 10 ms from /proc; and the
peak of the summed anonymous PSS (`Pss_Anon`: heap and other data, without the shared
libraries' code, whose PSS shrinks when other processes on the machine map the same files). All
include what the imports take (numpy, pyarrow, pandas…): the RSS right after them is
printed as well ("after imports"). Time is counted from after the imports on both sides (ours
import numpy.ma and dateutil before the clock: pyarrow imports them on first use, and HTA's
imports already hold them).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from hta_env import SHARED_TRACES, hta_python

FILES = [
    SHARED_TRACES / "trace_diff" / "control" / "control.json.gz",
    SHARED_TRACES / "trace_diff" / "test" / "test.json.gz",
]

_MEASURE = """
import resource, time
def _rss_mb():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
def _usage():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime, s.ru_maxrss, c.ru_maxrss
"""

OURS_CHILD = (
    _MEASURE
    + """
import json, sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from perfdiag.engine.kineto import read_kineto
from perfdiag.engine.summary import summarize
from perfdiag.api.taxonomy import same_columns
# Imported on first use (numpy.ma and dateutil by pyarrow, on the first array made from numpy
# and the first Python scalar): before the clock, as HTA's imports (pandas) already hold them.
import dateutil.relativedelta, numpy.ma
mode, summary = sys.argv[1], sys.argv[2] == "summary"
paths = [Path(name) for name in sys.argv[3:]]
def one(path):
    with same_columns():  # as perfdiag analyze reads and summarizes a trace
        events, meta = read_kineto(path)
        return summarize(events, meta).num_rows if summary else events.num_rows
imported = _rss_mb()
cpu0, _, _ = _usage()
t = time.perf_counter()
if mode == "threads":
    with ThreadPoolExecutor(len(paths)) as pool:
        rows = sum(pool.map(one, paths))
else:
    rows = sum(one(path) for path in paths)
wall = time.perf_counter() - t
cpu1, self_rss, child_rss = _usage()
print(json.dumps({"wall": wall, "cpu": cpu1 - cpu0, "maxrss": max(self_rss, child_rss) / 1024,
                  "imported": imported, "rows": rows}))
"""
)

# HTA parses ranks in worker processes: the script must be a file with a main guard.
HTA_CHILD = (
    _MEASURE
    + """
import json, logging, sys
from hta.trace_analysis import TraceAnalysis
if __name__ == "__main__":
    logging.disable(logging.CRITICAL)
    imported = _rss_mb()
    cpu0, _, _ = _usage()
    t = time.perf_counter()
    analysis = TraceAnalysis(trace_dir=sys.argv[1])
    wall = time.perf_counter() - t
    cpu1, self_rss, child_rss = _usage()
    rows = sum(len(analysis.t.get_trace(r)) for r in analysis.t.get_ranks())
    print(json.dumps({"wall": wall, "cpu": cpu1 - cpu0, "maxrss": max(self_rss, child_rss) / 1024,
                      "imported": imported, "rows": rows}))
"""
)


def _tree(root: int) -> list[int]:
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(parents.get(pid, []))
    return found


def _pss_mb(pid: int) -> tuple[float, float]:
    """(PSS, anonymous PSS) of a process, MB."""
    found = {"Pss:": 0.0, "Pss_Anon:": 0.0}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                key = line.split(maxsplit=1)[0]
                if key in found:
                    found[key] = int(line.split()[1]) / 1024
    except OSError:
        pass
    return found["Pss:"], found["Pss_Anon:"]


def measure(command: list[str], cwd: str | None = None) -> dict[str, Any]:
    """Run `command`, sampling its process tree's summed PSS; its JSON line + peak_pss."""
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=cwd)
    peak, peak_anon = 0.0, 0.0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak, peak_anon
        while not done.is_set():
            sizes = [_pss_mb(pid) for pid in _tree(child.pid)]
            peak = max(peak, sum(pss for pss, _ in sizes))
            peak_anon = max(peak_anon, sum(anon for _, anon in sizes))
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, _ = child.communicate()
    done.set()
    sampler.join()
    if child.returncode != 0:
        raise SystemExit(f"{command[:3]} failed with exit code {child.returncode}")
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    result["peak_pss"] = peak
    result["peak_anon"] = peak_anon
    return result


def report(label: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Print the lowest value over the runs of each figure (and the median wall time)."""
    low = {key: min(float(r[key]) for r in runs) for key in runs[0]}
    print(
        f"{label}: wall best {low['wall']:.3f} s (median "
        f"{statistics.median(r['wall'] for r in runs):.3f}), CPU {low['cpu']:.3f} s, "
        f"peak PSS of the process tree {low['peak_pss']:.0f} MB "
        f"(anonymous {low['peak_anon']:.0f} MB), max RSS of one process {low['maxrss']:.0f} MB "
        f"(after imports {low['imported']:.0f} MB), {runs[0]['rows']} rows",
        flush=True,
    )
    return low


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=Path, default=FILES)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--hta-python", help="a Python with HolisticTraceAnalysis 0.5.0")
    parser.add_argument("--no-hta", action="store_true", help="measure perfdiag alone")
    args = parser.parse_args()
    files = [str(f.resolve()) for f in args.files]
    print(f"{len(files)} files, load average {os.getloadavg()}, {os.cpu_count()} cores")
    results: dict[str, dict[str, Any]] = {}
    cases = [
        ("perfdiag read_kineto, one after the other", "sequential", "events"),
        ("perfdiag read_kineto, one thread per file", "threads", "events"),
        ("perfdiag read_kineto + summarize, one after the other", "sequential", "summary"),
        ("perfdiag read_kineto + summarize, one thread per file", "threads", "summary"),
    ]
    python = None if args.no_hta else hta_python(args.hta_python)
    with tempfile.TemporaryDirectory() as folder:
        for rank, path in enumerate(files):
            shutil.copy(path, Path(folder) / f"rank-{rank}.json.gz")
        script = Path(folder) / "hta_load.py"
        script.write_text(HTA_CHILD)
        # Interleaved, so that machine noise hits every case alike.
        runs: dict[str, list[dict[str, Any]]] = {}
        for _ in range(args.repeat):
            for label, mode, what in cases:
                command = [sys.executable, "-c", OURS_CHILD, mode, what, *files]
                # Outside the repository: its perfdiag/ folder would be found before the installed one.
                runs.setdefault(label, []).append(measure(command, cwd=folder))
            if python is not None:
                hta = [python, str(script), folder]
                runs.setdefault("HTA TraceAnalysis load", []).append(measure(hta, cwd=folder))
    for label, samples in runs.items():
        results[label] = report(label, samples)
    hta_best = results.get("HTA TraceAnalysis load")
    if hta_best is not None:
        for label, _, _ in cases:
            ours = results[label]
            print(
                f"HTA / {label}: {hta_best['wall'] / ours['wall']:.1f}× wall, "
                f"{hta_best['cpu'] / ours['cpu']:.1f}× CPU, "
                f"peak PSS {ours['peak_pss'] / hta_best['peak_pss']:.2f} of HTA's, "
                f"anonymous {ours['peak_anon'] / hta_best['peak_anon']:.2f} of HTA's"
            )


if __name__ == "__main__":
    main()
