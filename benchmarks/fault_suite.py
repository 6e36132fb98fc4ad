"""The fault suite: real training runs with injected faults, diagnosed through `perfdiag run`.

    python benchmarks/fault_suite.py --repeat 3 --load both --out /tmp/fault-suite

Each class of tests/support/perfdiag_testing/fault_suite.py (a DDP job over gloo on CPU, 2–4 ranks) runs
`--repeat` times as a user runs it — `perfdiag run --nproc-per-node N --out DIR -- fault_job.py
--fault CLASS …` in a fresh process — quiet and/or beside a noisy neighbour (`--load`: one
busy process per core, started by the suite for the duration of the loaded runs). The table
gives, per class and load, runs right / runs, and the healthy classes' false alarms. A run is
right when every culprit rank is named (no other), each with an allowed category and, where
the class injects it in a named user function, that function (tests/support/perfdiag_testing/fault_suite.py
`judge`). The captures stay in --out: `perfdiag analyze DIR` re-analyses any of them.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from perfdiag_testing.fault_suite import BY_NAME, CLASSES, Outcome, reanalyze, run_class


def _burn(deadline: float) -> None:
    x = 0
    while time.time() < deadline:
        x = (x * 31 + 7) % 1000003


@contextmanager
def noisy_neighbour(enabled: bool, max_seconds: float) -> Iterator[None]:
    """One busy process per core for at most `max_seconds` (bounded even if the suite dies)."""
    if not enabled:
        yield
        return
    deadline = time.time() + max_seconds
    hogs = [
        multiprocessing.Process(target=_burn, args=(deadline,), daemon=True)
        for _ in range(os.cpu_count() or 1)
    ]
    for hog in hogs:
        hog.start()
    try:
        yield
    finally:
        for hog in hogs:
            hog.terminate()
        for hog in hogs:
            hog.join()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--load", choices=("quiet", "loaded", "both"), default="both")
    parser.add_argument("--classes", nargs="*", default=None, help="names (default: all)")
    parser.add_argument("--out", default="/tmp/perfdiag-fault-suite")
    parser.add_argument("--timeout", type=float, default=240.0, help="per run, seconds")
    parser.add_argument(
        "--reanalyze",
        action="store_true",
        help="run no training: judge the captures already in --out again with `perfdiag analyze`",
    )
    args = parser.parse_args()
    chosen = [BY_NAME[n] for n in args.classes] if args.classes else list(CLASSES)
    if os.geteuid() != 0:
        skipped = [c.name for c in chosen if c.needs_root]
        chosen = [c for c in chosen if not c.needs_root]
        if skipped:
            print(f"not run (need root for a cpu cgroup): {', '.join(skipped)}", flush=True)
    loads = ["quiet", "loaded"] if args.load == "both" else [args.load]
    root = Path(args.out)
    results: dict[str, list[Outcome]] = {}
    if args.reanalyze:
        for load in loads:
            for fault_class in chosen:
                for capture in sorted((root / load).glob(f"{fault_class.name}-*")):
                    suffix = capture.name[len(fault_class.name) + 1 :]
                    if not capture.is_dir() or not suffix.isdigit():
                        continue
                    outcome = reanalyze(fault_class, capture)
                    results.setdefault(f"{fault_class.name}\t{load}", []).append(outcome)
                    _print_outcome(outcome, load)
        _print_table(results, loads)
        return 0 if all(o.right for v in results.values() for o in v) else 1
    for load in loads:
        budget = len(chosen) * args.repeat * (args.timeout + 60)
        with noisy_neighbour(load == "loaded", budget):
            for fault_class in chosen:
                for run in range(args.repeat):
                    out = root / load / f"{fault_class.name}-{run}"
                    outcome = run_class(fault_class, out, timeout_s=args.timeout)
                    results.setdefault(f"{fault_class.name}\t{load}", []).append(outcome)
                    _print_outcome(outcome, load)
    _print_table(results, loads)
    (root / "results.json").write_text(
        json.dumps({k: [o.__dict__ for o in v] for k, v in results.items()}, indent=1)
    )
    return 0 if all(o.right for v in results.values() for o in v) else 1


def _print_outcome(outcome: Outcome, load: str) -> None:
    mark = "ok " if outcome.right else "BAD"
    print(
        f"{mark} {load:<6} {outcome.fault_class:<15} {outcome.seconds:5.1f}s "
        f"load {os.getloadavg()[0]:4.1f} {outcome.status:<9} {outcome.why} [{outcome.top}]",
        flush=True,
    )


def _print_table(results: dict[str, list[Outcome]], loads: list[str]) -> None:
    print()
    print("| class | ranks | culprits | " + " | ".join(loads) + " |")
    print("|---|---|---|" + "---|" * len(loads))
    false_alarms = {load: [0, 0] for load in loads}
    for fault_class in CLASSES:
        cells = []
        for load in loads:
            runs = results.get(f"{fault_class.name}\t{load}")
            if runs is None:
                cells.append("–")
                continue
            right = sum(o.right for o in runs)
            cells.append(f"{right}/{len(runs)}")
            if fault_class.healthy:
                false_alarms[load][0] += len(runs) - right
                false_alarms[load][1] += len(runs)
        if all(c == "–" for c in cells):
            continue
        culprits = ",".join(map(str, fault_class.culprits)) or fault_class.kind or "none"
        print(
            f"| {fault_class.name} | {fault_class.ranks} | {culprits} | " + " | ".join(cells) + " |"
        )
    for load, (alarms, runs) in false_alarms.items():
        print(f"false alarms on healthy runs ({load}): {alarms}/{runs}")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
