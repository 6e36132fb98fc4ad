"""The GPU time breakdown (breakdown.json) against HTA's temporal breakdown.

The HTA figures below are what HolisticTraceAnalysis 0.5.0's `get_temporal_breakdown` printed on
the shared traces (benchmarks/hta_crosscheck.py; table in docs/hta_crosscheck.md). Ours must stay
within 1 percentage point of them; the split of HTA's non-compute share into communication and
memory, which HTA's temporal breakdown does not make, is pinned to what we computed when the
rest agreed with HTA.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from perfdiag.api.breakdown import RankBreakdown
from perfdiag.engine.breakdown import covered_ns, gpu_breakdown
from perfdiag.engine.kineto import read_kineto

TOLERANCE = 0.01

# file part → (HTA span s, HTA compute %, HTA non-compute %, HTA idle %, our comm %, our memory %)
HTA = {
    "alexnet": (12.996011, 0.08, 0.43, 99.49, 0.00, 0.43),
    "nccl_data": (0.435586, 17.26, 4.97, 77.78, 4.70, 0.40),
    "ns_resolution_trace": (0.384634, 96.75, 0.62, 2.63, 0.00, 0.90),
    "control": (0.383404, 61.23, 22.57, 16.20, 18.03, 4.54),
    "test.json": (0.628371, 68.31, 24.23, 7.47, 8.57, 15.66),
    "sampled_rank-0": (0.600058, 17.71, 28.74, 53.56, 28.63, 0.11),
    "sampled_rank-1": (0.600674, 22.57, 22.72, 54.72, 22.28, 0.44),
}


def _breakdown(path: Path) -> RankBreakdown:
    events, meta = read_kineto(path)
    return gpu_breakdown(events, meta.window.step_bounds_ns)


def test_every_gpu_trace_agrees_with_hta(hta_files: list[Path]) -> None:
    checked = set()
    for path in hta_files:
        found = [key for key in HTA if key in str(path)]
        if not found:
            continue
        (key,) = found
        checked.add(key)
        span, compute, non_compute, idle, comm, memory = HTA[key]
        b = _breakdown(path)
        assert b.gpu_compute is not None and b.idle is not None, path
        assert b.communication is not None and b.gpu_memory is not None
        assert b.gpu_other is not None
        assert b.span_s == pytest.approx(span, rel=1e-4), path
        assert abs(b.gpu_compute - compute / 100) <= TOLERANCE, (path, b)
        assert abs(b.idle - idle / 100) <= TOLERANCE, (path, b)
        assert abs(b.communication + b.gpu_memory + b.gpu_other - non_compute / 100) <= TOLERANCE
        assert abs(b.communication - comm / 100) <= TOLERANCE, (path, b)
        assert abs(b.gpu_memory - memory / 100) <= TOLERANCE, (path, b)
        total = b.gpu_compute + b.communication + b.gpu_memory + b.gpu_other + b.idle
        assert total == pytest.approx(1.0, abs=1e-9)
    assert checked == set(HTA)


def test_a_cpu_only_trace_has_no_shares(hta_files: list[Path]) -> None:
    path = next(p for p in hta_files if "cpu_only" in str(p))
    b = _breakdown(path)
    assert b.span_s == 0.0
    assert (b.gpu_compute, b.communication, b.gpu_memory, b.gpu_other, b.idle) == (None,) * 5


def test_covered_time_is_the_union_of_intervals() -> None:
    start = np.array([10, 0, 5, 30, 31, 50], dtype=np.int64)
    end = np.array([20, 8, 12, 40, 35, 50], dtype=np.int64)
    # [0, 20) + [30, 40) + the empty [50, 50)
    assert covered_ns(start, end) == 30
    assert covered_ns(start[:0], end[:0]) == 0
    rng = np.random.default_rng(3)
    s = rng.integers(0, 1000, 200)
    e = s + rng.integers(0, 50, 200)
    grid = np.zeros(1100, dtype=bool)
    for a, b in zip(s, e, strict=True):
        grid[a:b] = True
    assert covered_ns(s, e) == int(grid.sum())


def _gpu_events(make_events: Any) -> pa.Table:
    """Two steps; the host launches a kernel (corr 1) and an NCCL kernel (corr 2) in step 0
    and a memcpy (corr 3) in step 1. Kernel and NCCL overlap by 10 ns."""
    step = {"category": "annotation", "kineto_cat": "user_annotation", "tid": 1}
    launch = {
        "category": "cuda_runtime",
        "kineto_cat": "cuda_runtime",
        "name": "cudaLaunchKernel",
        "tid": 1,
        "dur": 5,
    }
    gpu = {"pid": 0, "device": 0}
    rows: list[dict[str, Any]] = [
        {**step, "name": "ProfilerStep#1", "ts": 0, "dur": 100},
        {**step, "name": "ProfilerStep#2", "ts": 100, "dur": 100, "step": 1},
        {**launch, "ts": 10, "correlation": 1},
        {**launch, "ts": 20, "correlation": 2},
        {**launch, "ts": 110, "correlation": 3, "step": 1},
        {
            **gpu,
            "category": "gpu_compute",
            "kineto_cat": "kernel",
            "name": "gemm",
            "ts": 40,
            "dur": 30,
            "correlation": 1,
            "tid": 7,
            "stream": 7,
        },
        {
            **gpu,
            "category": "communication",
            "kineto_cat": "kernel",
            "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)",
            "ts": 60,
            "dur": 40,
            "correlation": 2,
            "tid": 8,
            "stream": 8,
        },
        {
            **gpu,
            "category": "gpu_memory",
            "kineto_cat": "gpu_memcpy",
            "name": "Memcpy HtoD",
            "ts": 150,
            "dur": 20,
            "correlation": 3,
            "tid": 7,
            "stream": 7,
            "step": 1,
        },
    ]
    table: pa.Table = make_events(rows)
    return table


def test_shares_follow_the_priority_and_the_last_step_is_left_out(make_events: Any) -> None:
    events = _gpu_events(make_events)
    b = gpu_breakdown(events, [(0, 100), (100, 200)])
    # The memcpy was launched in the last step: left out, as HTA does. Span [40, 100).
    assert b.span_s == pytest.approx(60e-9)
    assert b.gpu_compute == pytest.approx(30 / 60)
    assert b.communication == pytest.approx(30 / 60)  # [70, 100): the overlap is compute
    assert b.gpu_memory == 0.0 and b.gpu_other == 0.0 and b.idle == pytest.approx(0.0)
    # One step only: everything counts. Span [40, 170): busy 60 + 20.
    one = gpu_breakdown(events, [(0, 200)])
    assert one.span_s == pytest.approx(130e-9)
    assert one.gpu_memory == pytest.approx(20 / 130)
    assert one.idle == pytest.approx(50 / 130)


def test_cuda_sync_records_are_non_compute_but_never_communication(make_events: Any) -> None:
    events = _gpu_events(make_events)
    sync = make_events(
        [
            {
                "category": "cuda_runtime",
                "kineto_cat": "cuda_sync",
                "name": "Context Sync",
                "pid": 0,
                "tid": -1,
                "device": 0,
                "stream": -1,
                "ts": 170,
                "dur": 30,
            }
        ]
    )
    b = gpu_breakdown(pa.concat_tables([events, sync]), [(0, 200)])
    assert b.span_s == pytest.approx(160e-9)
    assert b.gpu_other == pytest.approx(30 / 160) and b.communication == pytest.approx(30 / 160)
