"""perfdiag's GPU time breakdown (breakdown.json) next to HTA's temporal breakdown, on every
trace folder of the shared HTA test data.

    .venv/bin/python benchmarks/hta_crosscheck.py [--hta-python PYTHON] [--traces DIR]
        [--markdown FILE]

For each folder holding trace files (one HTA TraceAnalysis per folder, as HTA is meant to be
used), HTA's `get_temporal_breakdown` runs in its own Python (HolisticTraceAnalysis 0.5.0: see
hta_env.py; made under ~/.cache/perfdiag on first use unless --hta-python names one), and
perfdiag's `gpu_breakdown` on the same files. Prints one row per rank: span, compute, non-compute
(perfdiag: communication + gpu_memory + gpu_other) and idle shares of both tools, the largest
difference in percentage points, and the same difference once HTA's microsecond rounding of
nanosecond traces (ts rounded up, end rounded down: hta/common/trace_parser.py
round_down_time_stamps) is applied to perfdiag's events — which shows what the residual is.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from hta_env import SHARED_TRACES, hta_python

from perfdiag.api.breakdown import RankBreakdown
from perfdiag.engine.breakdown import gpu_breakdown
from perfdiag.engine.kineto import load_trace, read_kineto

# HTA parses ranks in worker processes: the script must be a file with a main guard.
HTA_CHILD = """
import json, logging, sys
logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
if __name__ == "__main__":
    try:
        frame = TraceAnalysis(trace_dir=sys.argv[1]).get_temporal_breakdown(visualize=False)
        print(json.dumps({"rows": frame.to_dict(orient="records")}, default=float))
    except Exception as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
"""


@dataclass
class Row:
    folder: str
    rank: int
    hta: dict[str, Any] | None  # shares in [0, 1] and span_s, or None when HTA failed
    hta_error: str | None
    ours: RankBreakdown
    ours_rounded: RankBreakdown


def trace_folders(root: Path) -> list[Path]:
    files = sorted(p for p in root.rglob("*") if p.name.endswith((".json", ".json.gz")))
    return sorted({p.parent for p in files})


def run_hta(python: str, folder: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "hta_breakdown.py"
        script.write_text(HTA_CHILD)
        done = subprocess.run(
            [python, str(script), str(folder)], capture_output=True, text=True, cwd=tmp, check=True
        )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def hta_rounded(events: pa.Table, base_ns: int) -> pa.Table:
    """The events as HTA reads a trace with sub-µs timestamps: `ts` (as written in the file,
    i.e. before baseTimeNanoseconds is added) parsed into a float64 of µs, then start rounded up
    and start + dur rounded down to whole µs."""
    ts = np.asarray(events["ts_ns"].to_numpy(), dtype=np.int64) - base_ns
    if not (ts % 1000).any():
        return events  # whole µs: HTA reads the column as integers, no rounding
    dur = np.asarray(events["dur_ns"].to_numpy(), dtype=np.int64)
    ts_us = (ts // 1000).astype(np.float64) + (ts % 1000) / 1000.0  # the float64 HTA parses
    end_us = ts_us + dur / 1000.0
    start = np.ceil(ts_us).astype(np.int64) * 1000
    end = np.floor(end_us).astype(np.int64) * 1000
    for name, column in (("ts_ns", start + base_ns), ("dur_ns", end - start)):
        events = events.set_column(events.schema.get_field_index(name), name, pa.array(column))
    return events


def rows_of(folder: Path, python: str, root: Path) -> list[Row]:
    hta = run_hta(python, folder)
    by_rank: dict[int, dict[str, Any]] = {}
    for record in hta.get("rows", []):
        by_rank[int(record["rank"])] = {
            "span_s": record["kernel_time(us)"] / 1e6,
            "compute": record["compute_time(us)"] / record["kernel_time(us)"],
            "non_compute": record["non_compute_time(us)"] / record["kernel_time(us)"],
            "idle": record["idle_time(us)"] / record["kernel_time(us)"],
        }
    rows = []
    for path in sorted(p for p in folder.iterdir() if p.name.endswith((".json", ".json.gz"))):
        events, meta = read_kineto(path)
        bounds = meta.window.step_bounds_ns
        rows.append(
            Row(
                folder=str(folder.relative_to(root)),
                rank=meta.rank,
                hta=by_rank.get(meta.rank),
                hta_error=hta.get("error"),
                ours=gpu_breakdown(events, bounds),
                ours_rounded=gpu_breakdown(hta_rounded(events, load_trace(path).base_ns), bounds),
            )
        )
    return rows


def non_compute(b: RankBreakdown) -> float | None:
    if b.communication is None or b.gpu_memory is None or b.gpu_other is None:
        return None
    return b.communication + b.gpu_memory + b.gpu_other


def max_diff_pp(b: RankBreakdown, hta: dict[str, Any] | None) -> float | None:
    if hta is None or b.gpu_compute is None or b.idle is None:
        return None
    ours = (b.gpu_compute, non_compute(b) or 0.0, b.idle)
    theirs = (hta["compute"], hta["non_compute"], hta["idle"])
    return max(abs(a - t) for a, t in zip(ours, theirs, strict=True)) * 100


def pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.2f}"


def table(rows: list[Row]) -> str:
    head = (
        "| folder | rank | span s HTA / ours | compute % HTA / ours | non-compute % HTA / ours "
        "| idle % HTA / ours | max Δ pp | max Δ pp, HTA's µs rounding | ours: comm / memory % |"
    )
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        b, h = r.ours, r.hta
        diff, diff_rounded = max_diff_pp(b, h), max_diff_pp(r.ours_rounded, h)
        if h is None:
            reason = (r.hta_error or "no row for this rank")[:60]
            hta_cells = [f"HTA fails: {reason}", "—", "—", "—"]
        else:
            hta_cells = [
                f"{h['span_s']:.4f} / {b.span_s:.4f}",
                f"{pct(h['compute'])} / {pct(b.gpu_compute)}",
                f"{pct(h['non_compute'])} / {pct(non_compute(b))}",
                f"{pct(h['idle'])} / {pct(b.idle)}",
            ]
        lines.append(
            "| "
            + " | ".join(
                [
                    r.folder,
                    str(r.rank),
                    *hta_cells,
                    "—" if diff is None else f"{diff:.2f}",
                    "—" if diff_rounded is None else f"{diff_rounded:.2f}",
                    f"{pct(b.communication)} / {pct(b.gpu_memory)}",
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hta-python", help="a Python with HolisticTraceAnalysis 0.5.0")
    parser.add_argument("--traces", type=Path, default=SHARED_TRACES)
    parser.add_argument("--markdown", type=Path, help="also write the table to this file")
    args = parser.parse_args()
    python = hta_python(args.hta_python)
    root = args.traces.resolve()
    rows = [row for folder in trace_folders(root) for row in rows_of(folder, python, root)]
    text = table(rows)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")


if __name__ == "__main__":
    main()
