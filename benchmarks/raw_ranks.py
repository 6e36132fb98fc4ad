"""Raw analysis of many synthetic GPU ranks, streamed.

Writes N ranks of Kineto traces (perfdiag_testing.synthetic_trace, one straggler), then runs
`perfdiag.analyzer.analyze` on the folder with progress shown, and prints wall time, peak
memory (ru_maxrss) and the verdict. Files are imported and summarized one at a time, so the
peak memory stays that of one trace plus the small per-rank summaries and collective calls.

    python benchmarks/raw_ranks.py --ranks 1000 --steps 4
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
from pathlib import Path

from perfdiag.analyzer import analyze
from perfdiag_testing.synthetic_trace import TraceFault, TraceJob


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--folder", type=Path, default=None)
    args = parser.parse_args()
    culprit = args.ranks * 3 // 4
    job = TraceJob(
        n_ranks=args.ranks,
        n_steps=args.steps,
        faults=[TraceFault("compute_straggler", (culprit,), factor=2.0)],
    )
    with tempfile.TemporaryDirectory(prefix="perfdiag-raw-") as tmp:
        folder = args.folder or Path(tmp) / "traces"
        started = time.perf_counter()
        paths = job.write(folder, progress=print)
        written = time.perf_counter() - started
        size = sum(p.stat().st_size for p in paths)
        print(f"generated {len(paths)} traces ({size / 1e6:.1f} MB gz) in {written:.1f} s")
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        last = [0.0]

        def progress(message: str) -> None:
            now = time.perf_counter()
            if now - last[0] >= 5 or not message.startswith("summarized"):
                print(f"  [{now - started:6.1f} s] {message}", flush=True)
                last[0] = now

        started = time.perf_counter()
        verdict = analyze(str(folder), progress=progress)
        elapsed = time.perf_counter() - started
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        top = verdict.findings[0] if verdict.findings else None
        print(
            f"analyzed {args.ranks} ranks × {args.steps} steps in {elapsed:.1f} s "
            f"({elapsed / args.ranks * 1000:.0f} ms/rank); peak RSS {peak:.0f} MB "
            f"(after generation: {rss_before:.0f} MB); load average {os.getloadavg()[0]:.1f}"
        )
        print(f"verdict: {verdict.status}; top finding: "
              f"{(top.kind, top.category, top.ranks) if top else None} (injected: {culprit})")  # fmt: skip


if __name__ == "__main__":
    main()
