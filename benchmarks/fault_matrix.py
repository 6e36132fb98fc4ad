"""Print the synthetic GPU fault matrix (docs/analysis.md): each scenario of
perfdiag_testing.fault_matrix written as Kineto traces and run through `analyze()`, over a few
seeds; one Markdown row per scenario with what the top finding says.

    python benchmarks/fault_matrix.py --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from perfdiag.analyzer import analyze
from perfdiag_testing.fault_matrix import scenarios


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    print(
        "| fault (on rank 5 of 8) | expected | analyze() says (top finding, seed 0) | seeds right |"
    )
    print("|---|---|---|---|")
    rows: dict[str, list[str]] = {}
    right: dict[str, int] = {}
    for seed in args.seeds:
        for scenario in scenarios(seed):
            with tempfile.TemporaryDirectory() as tmp:
                scenario.job.write(Path(tmp))
                verdict = analyze(tmp)
            top = verdict.findings[0] if verdict.findings else None
            if scenario.culprit is None:
                ok = top is None
                expected = "no finding (healthy)"
            else:
                ok = top is not None and (top.ranks, top.category) == (
                    [scenario.culprit],
                    scenario.category,
                )
                expected = f"rank {scenario.culprit}, {scenario.category}"
            said = (
                f"{top.kind} · {top.category} · ranks {top.ranks} · "
                f"{(top.function or '-')[:40]} · severity {top.severity:.0%}"
                if top
                else f"{verdict.status}, no finding"
            )
            rows.setdefault(scenario.name, [expected, said])
            right[scenario.name] = right.get(scenario.name, 0) + int(ok)
    for name, (expected, said) in rows.items():
        print(f"| {name} | {expected} | {said} | {right[name]}/{len(args.seeds)} |")


if __name__ == "__main__":
    main()
