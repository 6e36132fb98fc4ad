"""The GPU work behind a rank's GPU excess, named to the kernel (or copy): which of its kernels
hold more time than its peers', how often they ran and how long each call took against theirs.

A GPU culprit is only actionable with its kernels: the same kernels with longer calls point at
larger inputs (longer sequences, a larger micro-batch) or a slower GPU; kernels its peers do
not run (or run far less) point at different code paths (fp32 instead of autocast, TF32 or
cudnn.benchmark off, unfused ops). Read from the summaries (`wall_ms`, `count`,
`dur_median_us`), so it needs no raw events.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfdiag.analyzer.text import short

TOP_KERNELS = 3
GPU_CATEGORIES = ("gpu_compute", "gpu_memory")


@dataclass(frozen=True)
class KernelGrowth:
    """One kernel's time per step on the rank against its peers' median (0 where they do not
    run it)."""

    name: str
    category: str
    ms_per_step: float
    peers_ms_per_step: float
    calls_per_step: float
    peers_calls_per_step: float
    call_us: float
    peers_call_us: float | None
    """Median duration of one call on the peers; None where they do not run it."""

    @property
    def excess_ms(self) -> float:
        return self.ms_per_step - self.peers_ms_per_step

    def describe(self) -> str:
        calls = f"{self.calls_per_step:.3g} calls/step"
        if self.peers_call_us is None:
            return (
                f"{short(self.name)} {self.ms_per_step:.2f} ms/step ({calls} of "
                f"{self.call_us:.0f} µs), which its peers do not run"
            )
        return (
            f"{short(self.name)} {self.peers_ms_per_step:.2f} → {self.ms_per_step:.2f} ms/step "
            f"({self.peers_calls_per_step:.3g} → {calls}, "
            f"{self.peers_call_us:.0f} → {self.call_us:.0f} µs per call)"
        )

    def evidence(self) -> dict[str, object]:
        return {
            "kernel": self.name,
            "category": self.category,
            "ms_per_step": round(self.ms_per_step, 3),
            "peers_median_ms_per_step": round(self.peers_ms_per_step, 3),
            "calls_per_step": round(self.calls_per_step, 3),
            "peers_median_calls_per_step": round(self.peers_calls_per_step, 3),
            "median_call_us": round(self.call_us, 2),
            "peers_median_call_us": (
                round(self.peers_call_us, 2) if self.peers_call_us is not None else None
            ),
        }


def grown_kernels(
    summary: pa.Table, rank: int, peers: list[int], steps: dict[int, int]
) -> list[KernelGrowth]:
    """The rank's kernels and copies whose time per step most exceeds its peers' median,
    largest first (at most TOP_KERNELS, only those that grew). `steps`: window steps per rank."""
    others = [p for p in peers if p != rank]
    if not others:
        return []
    rows = summary.filter(
        pc.and_(
            pc.is_in(summary.column("category"), pa.array(GPU_CATEGORIES)),
            pc.is_in(summary.column("rank"), pa.array([rank, *others], pa.int32())),
        )
    )
    # The folded "<other>" rows are no kernel of their own.
    rows = rows.filter(pc.invert(pc.starts_with(rows.column("function"), "<")))
    if rows.num_rows == 0:
        return []
    names = pc.dictionary_encode(rows.column("function").combine_chunks())
    code = names.indices.to_numpy()
    kernel_names = names.dictionary.to_pylist()
    ranks = rows.column("rank").to_numpy()
    per_step = np.array([max(steps.get(int(r), 1), 1) for r in ranks.tolist()], dtype=float)
    ms = rows.column("wall_ms").fill_null(0).to_numpy() / per_step
    calls = rows.column("count").fill_null(0).to_numpy() / per_step
    call_us = rows.column("dur_median_us").fill_null(np.nan).to_numpy()
    categories = rows.column("category").to_pylist()

    n = len(kernel_names)
    order = {r: j for j, r in enumerate([rank, *others])}
    at = np.array([order[int(r)] for r in ranks.tolist()])
    table_ms = np.zeros((len(order), n))
    table_calls = np.zeros((len(order), n))
    table_us = np.full((len(order), n), np.nan)
    table_ms[at, code] = ms
    table_calls[at, code] = calls
    table_us[at, code] = call_us
    category_of = {int(c): str(k) for c, k in zip(code.tolist(), categories, strict=True)}

    peers_ms = np.median(table_ms[1:], axis=0)
    excess = table_ms[0] - peers_ms
    grown = [int(j) for j in np.argsort(-excess) if excess[j] > 0][:TOP_KERNELS]
    out = []
    for j in grown:
        ran = table_calls[1:, j] > 0
        out.append(
            KernelGrowth(
                name=str(kernel_names[j]),
                category=category_of[j],
                ms_per_step=float(table_ms[0, j]),
                peers_ms_per_step=float(peers_ms[j]),
                calls_per_step=float(table_calls[0, j]),
                peers_calls_per_step=float(np.median(table_calls[1:, j])),
                call_us=float(table_us[0, j]),
                peers_call_us=float(np.nanmedian(table_us[1:, j][ran])) if ran.any() else None,
            )
        )
    return out
