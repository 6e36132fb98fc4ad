"""Collective matching across ranks (analyzer/compare/collectives.py) on hand-made calls: the split into
wait and transfer, the late arriver, bus bandwidth, and the fallback when clocks disagree."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from perfdiag.analyzer.compare.collectives import bus_factor, match_instances
from perfdiag.analyzer.load.collective_calls import COLLECTIVES_SCHEMA, collective_calls
from perfdiag.engine.kineto import read_kineto
from perfdiag_testing.synthetic_trace import TraceJob

MS = 1_000_000


def calls(rows: list[tuple[int, int, int, int]]) -> pa.Table:
    """(rank, seq, start ns, duration ns) of allreduces of 100 MB in group "0"."""
    n = len(rows)
    return pa.table(
        {
            "rank": pa.array([r[0] for r in rows], pa.int32()),
            "pg_name": ["0"] * n,
            "collective": ["allreduce"] * n,
            "seq": pa.array([r[1] for r in rows], pa.int64()),
            "ts_ns": pa.array([r[2] for r in rows], pa.int64()),
            "dur_ns": pa.array([r[3] for r in rows], pa.int64()),
            "msg_bytes": pa.array([100_000_000] * n, pa.int64()),
            "group_size": pa.array([4] * n, pa.int32()),
            "step": pa.array([0] * n, pa.int32()),
            "device": [True] * n,
        },
        schema=COLLECTIVES_SCHEMA,
    )


def test_wait_transfer_split_and_late_arriver() -> None:
    # Rank 3 arrives 4 ms late; every rank finishes at 10 ms: transfer 5 ms for all.
    m = match_instances(
        calls([(0, 0, 1 * MS, 9 * MS), (1, 0, 1 * MS, 9 * MS), (2, 0, 2 * MS, 8 * MS),
               (3, 0, 5 * MS, 5 * MS)])
    )  # fmt: skip
    assert m is not None and m.clock_aligned
    order = np.argsort(m.rank)
    assert m.wait_ns[order].tolist() == [4 * MS, 4 * MS, 3 * MS, 0]
    assert m.transfer_ns[order].tolist() == [5 * MS] * 4
    assert m.last[order].tolist() == [False, False, False, True]
    # 100 MB in 5 ms = 20 GB/s algorithmic; ×2·3/4 on the bus.
    assert m.algbw_gbps[order] == pytest.approx([20.0] * 4)
    assert m.busbw_gbps[order] == pytest.approx([30.0] * 4)


def test_unmatched_calls_and_disagreeing_clocks() -> None:
    # Rank 1's clock is 1 s off: its calls never overlap the others' → durations only.
    rows = []
    for seq in range(4):
        base = seq * 20 * MS
        rows += [(0, seq, base, 9 * MS), (1, seq, base + 1000 * MS, 6 * MS)]
    rows.append((0, 99, 0, MS))  # seen on one rank only: not matched
    m = match_instances(calls(rows))
    assert m is not None and not m.clock_aligned
    assert len(m.rank) == 8
    assert sorted(set(m.transfer_ns.tolist())) == [6 * MS]
    assert m.wait_ns[m.rank == 0].tolist() == [3 * MS] * 4
    assert m.last[m.rank == 1].all()


def test_bus_factors() -> None:
    assert bus_factor("allreduce", 8) == pytest.approx(1.75)
    assert bus_factor("allgather", 8) == pytest.approx(0.875)
    assert bus_factor("reducescatter", 4) == pytest.approx(0.75)
    assert bus_factor("sendrecv", 2) == 1.0
    assert bus_factor("allreduce", 1) == 1.0


def test_calls_of_a_trace_are_the_nccl_kernels(tmp_path: Path) -> None:
    job = TraceJob(n_ranks=2, n_steps=3)
    path = job.write(tmp_path)[0]
    events, _ = read_kineto(path)
    table = collective_calls(events)
    # 3 buckets per step, one NCCL kernel each; the record_param_comms ops are not calls.
    assert table.num_rows == 9
    assert set(table["collective"].to_pylist()) == {"allreduce"}
    assert table["seq"].to_pylist() == list(range(9))
    assert set(table["msg_bytes"].to_pylist()) == {50_000_000}
    assert all(table["device"].to_pylist())
