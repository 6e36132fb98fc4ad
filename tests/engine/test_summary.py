"""Behavior-pattern summaries: invariants on real traces, exact values on hand-built ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from perfdiag.api.schema import (
    IDLE,
    IDLE_FUNCTION,
    OTHER_FUNCTION,
    SUMMARY_SCHEMA,
    SUMMARY_SCHEMA_ID,
    WindowMeta,
    WorkerMeta,
    read_meta,
)
from perfdiag.engine.kineto import read_kineto
from perfdiag.engine.summary import summarize


def check_invariants(summary: pa.Table, meta: WorkerMeta) -> None:
    assert summary.schema.equals(SUMMARY_SCHEMA, check_metadata=False)
    assert read_meta(summary.schema, SUMMARY_SCHEMA_ID) == meta
    beta = np.array(summary["beta"].to_pylist())
    assert abs(beta.sum() - 1.0) < 1e-6
    assert (beta >= 0).all()
    per_step = np.array(summary["beta_per_step"].to_pylist(), dtype=np.float64)
    assert per_step.shape == (summary.num_rows, meta.window.steps)
    assert np.allclose(per_step.sum(axis=0), 1.0, atol=1e-5)
    window_ms = sum(e - s for s, e in meta.window.step_bounds_ns) / 1e6
    assert np.allclose(np.array(summary["time_ms"].to_pylist()), beta * window_ms)
    idle = summary.filter(pc.equal(summary["category"], IDLE))
    assert idle.num_rows == 1 and idle["function"][0].as_py() == IDLE_FUNCTION
    keys = list(zip(summary["function"].to_pylist(), summary["category"].to_pylist(), strict=True))
    assert len(keys) == len(set(keys))
    assert set(summary["rank"].to_pylist()) == {meta.rank}
    assert beta.tolist() == sorted(beta.tolist(), reverse=True)
    assert not any(" at 0x" in f for f in summary["function"].to_pylist())


def test_invariants_on_every_real_trace(hta_files: list[Path]) -> None:
    for path in hta_files:
        events, meta = read_kineto(path)
        summary = summarize(events, meta)
        check_invariants(summary, meta)
        assert summary.num_rows <= 500


def test_gpu_trace_top_contributors_are_kernels(hta_files: list[Path]) -> None:
    path = next(p for p in hta_files if "control" in str(p))
    events, meta = read_kineto(path)
    summary = summarize(events, meta).to_pylist()
    top = summary[0]
    assert top["category"] == "communication" and top["function"].startswith("ncclKernel_SendRecv")
    by_category: dict[str, float] = {}
    for row in summary:
        by_category[row["category"]] = by_category.get(row["category"], 0.0) + row["beta"]
    assert by_category["gpu_compute"] > by_category["cuda_runtime"]
    step = next(r for r in summary if r["function"] == "ProfilerStep#*")
    assert step["beta"] == 0.0 and step["count"] == meta.window.steps  # a container: not charged
    assert step["wall_ms"] == pytest.approx(sum(meta.window.step_times_ms), rel=0.01)


def _meta(bounds: list[tuple[int, int]]) -> WorkerMeta:
    return WorkerMeta(
        rank=2,
        window=WindowMeta(id="w", start_step=10, steps=len(bounds), step_bounds_ns=bounds),
    )


def test_exact_values_on_a_hand_built_window(make_events: Any) -> None:
    rows = []
    for step, base in enumerate((0, 1000)):
        rows += [
            dict(
                name=f"ProfilerStep#{10 + step}",
                category="annotation",
                kineto_cat="user_annotation",
                ts=base,
                dur=1000,
                tid=1,
                step=step,
            ),
            dict(
                name="aten::mm",
                category="cpu_op",
                kineto_cat="cpu_op",
                ts=base + 100,
                dur=200,
                tid=1,
                step=step,
            ),
            dict(
                name="aten::mm",
                category="cpu_op",
                kineto_cat="cpu_op",
                ts=base + 400,
                dur=100 * (step + 1),
                tid=1,
                step=step,
            ),
            dict(
                name="gloo:all_reduce",
                category="communication",
                kineto_cat="user_annotation",
                ts=base + 450,
                dur=300,
                tid=2,
                step=step,
            ),
        ]
    events = make_events(rows)
    meta = _meta([(0, 1000), (1000, 2000)])
    summary = summarize(events, meta)
    check_invariants(summary, meta)
    by_key = {(r["function"], r["category"]): r for r in summary.to_pylist()}
    mm = by_key[("aten::mm", "cpu_op")]
    assert mm["count"] == 4
    assert mm["time_ms"] == pytest.approx((200 + 100 + 200 + 200) / 1e6)
    assert mm["wall_ms"] == pytest.approx(700 / 1e6)
    assert mm["dur_median_us"] == pytest.approx(np.median([200, 100, 200, 200]) / 1e3)
    assert mm["dur_p95_us"] == pytest.approx(np.quantile([200, 100, 200, 200], 0.95) / 1e3)
    assert mm["beta_per_step"] == pytest.approx([0.3, 0.4])
    gloo = by_key[("gloo:all_reduce", "communication")]
    # Step 0: 500-750 beyond the op; step 1: 1600-1750.
    assert gloo["beta_per_step"] == pytest.approx([0.25, 0.15])
    assert by_key[(IDLE_FUNCTION, IDLE)]["beta_per_step"] == pytest.approx([0.45, 0.45])
    container = by_key[("ProfilerStep#*", "annotation")]
    assert container["beta"] == 0.0 and container["count"] == 2


def test_small_functions_fold_into_other(make_events: Any) -> None:
    rows = [dict(name="big", category="cpu_op", kineto_cat="cpu_op", ts=0, dur=9000, tid=1)]
    rows += [
        dict(
            name=f"tiny{i}", category="cpu_op", kineto_cat="cpu_op", ts=9000 + i * 10, dur=5, tid=1
        )
        for i in range(50)
    ]
    rows += [
        dict(name="py", category="python", kineto_cat="python_function", ts=9600, dur=3, tid=1)
    ]
    events = make_events(rows)
    meta = _meta([(0, 10000)])
    summary = summarize(events, meta, beta_floor=0.01)
    check_invariants(summary, meta)
    keys = {(r["function"], r["category"]): r for r in summary.to_pylist()}
    assert set(keys) == {
        ("big", "cpu_op"),
        (OTHER_FUNCTION, "cpu_op"),
        (OTHER_FUNCTION, "python"),
        (IDLE_FUNCTION, IDLE),
    }
    other = keys[(OTHER_FUNCTION, "cpu_op")]
    assert other["count"] == 50 and other["time_ms"] == pytest.approx(250 / 1e6)
    assert other["dur_median_us"] == pytest.approx(0.005)


def test_row_cap(make_events: Any) -> None:
    rows = [
        dict(
            name=f"op{i}",
            category="cpu_op",
            kineto_cat="cpu_op",
            ts=i * 10,
            dur=10 - (i % 3),
            tid=1,
        )
        for i in range(300)
    ]
    events = make_events(rows)
    meta = _meta([(0, 3000)])
    summary = summarize(events, meta, max_rows=40)
    check_invariants(summary, meta)
    assert summary.num_rows <= 40
    assert OTHER_FUNCTION in summary["function"].to_pylist()
    assert pc.sum(summary["count"]).as_py() == 300


def test_empty_window_is_all_idle(make_events: Any) -> None:
    meta = _meta([(0, 10), (10, 20)])
    summary = summarize(make_events([]), meta)
    check_invariants(summary, meta)
    assert summary.to_pylist()[0]["beta_per_step"] == [1.0, 1.0]
