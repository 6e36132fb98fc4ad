"""Each rank's CPU use per step as the comparison reads it, from the `HostUsage` the agent
computed (perfdiag/engine/host_usage.py)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from numpy.typing import NDArray

from perfdiag.analyzer.load.worker_table import WorkerMetas
from perfdiag.api.schema import HostUsage, WorkerMeta


def cpu_wait_matrix(
    metas: Mapping[int, WorkerMeta], ranks: NDArray[np.int64], width: int
) -> NDArray[np.float64] | None:
    """(R, width) run-queue wait of each rank's training thread per step, ms; None unless every
    rank has it (comparing adjusted with unadjusted ranks would favour the latter)."""
    if not WorkerMetas.of(metas).all_host_usage(ranks):
        return None
    out = np.full((len(ranks), max(width, 1)), np.nan)
    for i, rank in enumerate(ranks.tolist()):
        usage = metas[rank].host_usage
        if usage is None:
            return None
        values = np.asarray(outside_communication(usage)[:width])
        out[i, : len(values)] = values
    return out


def outside_communication(usage: HostUsage) -> list[float]:
    """The training thread's run-queue wait per step outside communication, ms."""
    if usage.main_wait_communication_ms is None:
        return usage.main_wait_ms
    return [
        max(0.0, total - inside)
        for total, inside in zip(usage.main_wait_ms, usage.main_wait_communication_ms, strict=True)
    ]
