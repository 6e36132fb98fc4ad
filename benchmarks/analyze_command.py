"""`perfdiag analyze` next to HTA as users run them: each tool a fresh process on the same trace
folder, in one run — wall time, CPU time of the process and its children, peak memory.

    .venv/bin/python benchmarks/analyze_command.py [--repeat 3] [--hta-python PYTHON]
        [--no-hta] [--sets shared,synthetic] [--ranks 8] [--mb 50] [--scaling] [--jobs N]

- perfdiag: `perfdiag analyze DIR --out OUT --quiet` (the console script of this Python's
  environment): import, summary, cross-rank analysis, verdict.json, report.html,
  timeline.json.gz and breakdown.json;
- HTA: a Python script running HolisticTraceAnalysis 0.5.0's `TraceAnalysis(trace_dir=DIR)`
  and `get_temporal_breakdown(visualize=False)` (its Python: hta_env.py), imports included.

Sets: `shared`, the two largest shared HTA traces (trace_diff control + test: 35 + 33 MB of
JSON, gzipped) as ranks 0 and 1; `gpt2`, the two GPT-2 pairs of ../shared/traces/gpu-gpt2
(healthy/ and fp32-rank1/: 2 ranks of 30–35 MB of JSON each, as perfdiag's hook wrote them on
an H200); `synthetic`, `--ranks` ranks of `--mb` MB of JSON each (about:
the step count is sized from a 2-step probe), gzipped, written by perfdiag_testing.synthetic_trace
into ~/.cache/perfdiag/bench-traces (kept for the next run). `--scaling` adds synthetic sets of
2, 4 and `--ranks` ranks at `--mb`, and 2 ranks at twice `--mb`.

`--jobs N` adds a row for `perfdiag analyze --jobs N` (N trace files read at a time).

`--before PYTHONPATH` adds a row for an older perfdiag run by the same console script (an export
of its perfdiag/ with analyzer/, collector/ and operator/ linked inside it, and the built
_scan extension copied in).

Figures, each the lowest over the repetitions (runs interleaved, so that machine noise hits both
tools alike): wall time from the start of the process to its exit; CPU time, user + system, of
the process and every child it waited for (os.wait4); peak RSS, the largest resident set of any
one process of the command (what `/usr/bin/time` reports: wait4's ru_maxrss); and the peak of the
summed PSS of the whole process tree (sampled every 10 ms from /proc; HTA parses ranks in
forked processes, whose memory the largest-process figure leaves out).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from hta_env import SHARED_TRACES, hta_python
from kineto_ingest import _pss_mb, _tree

SHARED = [
    SHARED_TRACES / "trace_diff" / "control" / "control.json.gz",
    SHARED_TRACES / "trace_diff" / "test" / "test.json.gz",
]
GPT2 = SHARED_TRACES.parent / "gpu-gpt2"
CACHE = Path.home() / ".cache" / "perfdiag" / "bench-traces"

# HTA parses ranks in worker processes: the script must be a file with a main guard.
HTA_SCRIPT = """
import logging, sys
from hta.trace_analysis import TraceAnalysis
if __name__ == "__main__":
    logging.disable(logging.CRITICAL)
    frame = TraceAnalysis(trace_dir=sys.argv[1]).get_temporal_breakdown(visualize=False)
    print(len(frame))
"""


def measure(command: list[str], cwd: str, pythonpath: str | None = None) -> dict[str, float]:
    """Run `command` to its end: wall s, CPU s (it and its children), max RSS MB of one
    process, peak summed PSS MB of its process tree."""
    env = {**os.environ, "PYTHONPATH": pythonpath} if pythonpath else None
    start = time.perf_counter()
    child = subprocess.Popen(command, cwd=cwd, stdout=subprocess.DEVNULL, env=env)
    peak = 0.0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, sum(_pss_mb(pid)[0] for pid in _tree(child.pid)))
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    done.set()
    sampler.join()
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"{command[:3]} failed with exit code {child.returncode}")
    return {
        "wall": wall,
        "cpu": usage.ru_utime + usage.ru_stime,
        "rss": usage.ru_maxrss / 1024,
        "pss": peak,
    }


def json_mb(folder: Path) -> float:
    import gzip

    total = 0
    for path in sorted(folder.glob("*.json.gz")):
        with gzip.open(path, "rb") as fh:
            while chunk := fh.read(1 << 22):
                total += len(chunk)
    return total / 1e6


def synthetic(ranks: int, mb: float) -> Path:
    """A folder of `ranks` synthetic traces of about `mb` MB of JSON each (made once)."""
    folder = CACHE / f"r{ranks}-mb{mb:g}"
    if (folder / "done").exists():
        return folder
    from perfdiag_testing.synthetic_trace import TraceFault, TraceJob

    layers = 48
    with tempfile.TemporaryDirectory() as probe:
        TraceJob(n_ranks=1, n_steps=2, layers=layers).write(Path(probe))
        per_step = json_mb(Path(probe)) / 2
    steps = max(4, round(mb / per_step))
    shutil.rmtree(folder, ignore_errors=True)
    print(f"writing {folder}: {ranks} ranks × {steps} steps …", flush=True)
    job = TraceJob(
        n_ranks=ranks,
        n_steps=steps,
        layers=layers,
        faults=[TraceFault("compute_straggler", (ranks // 2,), factor=1.5)],
    )
    job.write(folder)
    (folder / "done").write_text("")
    return folder


def shared_set(tmp: Path) -> Path:
    folder = tmp / "shared"
    folder.mkdir()
    for rank, path in enumerate(SHARED):
        # Links, not copies: the traces stay in the shared folder (read only).
        (folder / f"rank-{rank}.json.gz").symlink_to(path)
    return folder


def compare(
    name: str,
    folder: Path,
    repeat: int,
    hta: str | None,
    tmp: Path,
    before: str | None = None,
    jobs: int | None = None,
) -> dict[str, Any]:
    perfdiag = str(Path(sys.executable).with_name("perfdiag"))
    script = tmp / "hta_breakdown.py"
    script.write_text(HTA_SCRIPT)
    side = f"--jobs {jobs}"
    runs: dict[str, list[dict[str, float]]] = {"perfdiag": [], side: [], "before": [], "HTA": []}
    for _ in range(repeat):
        out = tmp / "out"
        shutil.rmtree(out, ignore_errors=True)
        command = [perfdiag, "analyze", str(folder), "--out", str(out), "--quiet"]
        runs["perfdiag"].append(measure(command, cwd=str(tmp)))
        if jobs is not None:
            shutil.rmtree(out, ignore_errors=True)
            runs[side].append(measure([*command, "--jobs", str(jobs)], cwd=str(tmp)))
        if before is not None:
            shutil.rmtree(out, ignore_errors=True)
            runs["before"].append(measure(command, cwd=str(tmp), pythonpath=before))
        if hta is not None:
            runs["HTA"].append(measure([hta, str(script), str(folder)], cwd=str(tmp)))
    files = len(list(folder.glob("*.json.gz")))
    result: dict[str, Any] = {"set": name, "ranks": files, "json_mb": json_mb(folder)}
    for tool, samples in runs.items():
        if samples:
            result[tool] = {key: min(s[key] for s in samples) for key in samples[0]}
    line = f"{name}: {files} ranks, {result['json_mb']:.0f} MB of JSON"
    for tool in ("perfdiag", side, "before", "HTA"):
        if tool in result:
            r = result[tool]
            line += (
                f"\n  {tool:10s} wall {r['wall']:6.2f} s  CPU {r['cpu']:6.2f} s  "
                f"peak RSS {r['rss']:5.0f} MB  tree PSS {r['pss']:5.0f} MB"
            )
    for tool in ("perfdiag", side):
        if "HTA" in result and tool in result:
            ours, theirs = result[tool], result["HTA"]
            line += (
                f"\n  HTA / {tool}: {theirs['wall'] / ours['wall']:.1f}× wall, "
                f"{theirs['cpu'] / ours['cpu']:.1f}× CPU; peak RSS "
                f"{ours['rss'] / theirs['rss']:.2f} of HTA's, tree PSS "
                f"{ours['pss'] / theirs['pss']:.2f}"
            )
    print(line, flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--hta-python", help="a Python with HolisticTraceAnalysis 0.5.0")
    parser.add_argument("--no-hta", action="store_true", help="measure perfdiag alone")
    parser.add_argument("--sets", default="shared,gpt2,synthetic")
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--mb", type=float, default=50.0)
    parser.add_argument("--scaling", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--jobs", type=int, help="also run `perfdiag analyze --jobs N` (a '--jobs N' row)"
    )
    parser.add_argument(
        "--before",
        metavar="PYTHONPATH",
        help="also run the command with this PYTHONPATH first (an export of an older perfdiag, "
        "its analyzer/collector/operator linked into its perfdiag/): a 'before' row",
    )
    args = parser.parse_args()
    hta = None if args.no_hta else hta_python(args.hta_python)
    print(f"load average {os.getloadavg()}, {os.cpu_count()} cores", flush=True)
    sets: list[tuple[str, Path | None]] = []
    if "shared" in args.sets:
        sets.append(("shared HTA traces", None))
    if "gpt2" in args.sets:
        sets += [(f"GPT-2 {name}", GPT2 / name) for name in ("healthy", "fp32-rank1")]
    if "synthetic" in args.sets:
        sets.append((f"synthetic {args.ranks}×{args.mb:g} MB", synthetic(args.ranks, args.mb)))
    if args.scaling:
        for ranks, mb in ((2, args.mb), (4, args.mb), (2, 2 * args.mb)):
            sets.append((f"synthetic {ranks}×{mb:g} MB", synthetic(ranks, mb)))
    results = []
    with tempfile.TemporaryDirectory(prefix="perfdiag-bench-") as name:
        tmp = Path(name)
        for label, folder in sets:
            found = folder or shared_set(tmp)
            results.append(compare(label, found, args.repeat, hta, tmp, args.before, args.jobs))
    print(f"load average {os.getloadavg()}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
