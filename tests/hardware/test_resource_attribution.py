"""Hardware in the analysis: sample streams replayed through the agent's code path
(collector.hardware.hardware_table → analyzer.hardware_samples.with_resources on the worker's
summary) and then the cross-worker analysis. The streams are synthetic (no GPU, NIC or noisy
neighbour on this machine), generated at the sampler's 1 kHz from the executions' intervals:
the resource of a rank is what its hardware would have shown while each function ran.

A 4-rank GPU-like job, 10 steps of 100 ms: the host launches (5 ms of Python), a GEMM kernel
runs 60 ms, then an NCCL all-reduce 30 ms. Faults:
- rank 2's GPU throttles (SM clock 1100 instead of 1410 MHz inside its kernels) → gpu_hardware;
- rank 1's NIC moves 4 GB/s instead of 12 GB/s during its collectives → network;
- rank 3's thread gets half a CPU while runnable (noisy neighbour) → host;
- rank 0 runs extra Python (a software cause) with a normal CPU share → python, not host.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pytest

from perfdiag.analyzer.capture import Capture
from perfdiag.analyzer.hardware_samples import with_resources
from perfdiag.analyzer.pipeline import analyze_capture
from perfdiag.collector.hardware import Series, hardware_table
from perfdiag.schema import EVENTS_SCHEMA, WindowMeta, WorkerMeta
from perfdiag.summary import summarize

STEPS = 10
STEP_NS = 100_000_000
MS = 1_000_000
T0 = 1_790_000_000_000_000_000  # epoch ns, as Kineto and the sampler write them
GEMM = "ampere_sgemm_128x64_nn"
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
PY = "train.py(31): forward"


@dataclass
class RankFault:
    sm_clock: float = 1410.0
    nic_gbps: float = 12.0
    cpu_share: float = 0.98
    gemm_ms: float = 60.0
    nccl_ms: float = 30.0
    python_ms: float = 5.0
    extra: dict[str, float] = field(default_factory=dict)


def build_rank(rank: int, fault: RankFault) -> tuple[pa.Table, WorkerMeta, list[Series]]:
    rows: list[dict[str, object]] = []
    bounds = []
    step_ns = STEP_NS + int(
        (fault.python_ms - 5.0 + fault.gemm_ms - 60.0 + fault.nccl_ms - 30.0) * MS
    )
    for step in range(STEPS):
        start = T0 + step * step_ns
        bounds.append((start, start + step_ns))
        py_end = start + int(fault.python_ms * MS)
        gemm_end = py_end + int(fault.gemm_ms * MS)
        nccl_end = gemm_end + int(fault.nccl_ms * MS)
        rows += [
            _event(rank, PY, "python", "python_function", start, py_end, step, 1, 1),
            _event(rank, GEMM, "gpu_compute", "kernel", py_end, gemm_end, step, 0, 7, device=0),
            _event(rank, NCCL, "communication", "kernel", gemm_end, nccl_end, step, 0, 20, 0),
        ]
    events = pa.Table.from_pylist(rows, schema=EVENTS_SCHEMA)
    meta = WorkerMeta(
        rank=rank,
        world_size=4,
        host=f"node{rank}",
        window=WindowMeta(id="w", start_step=10, steps=STEPS, step_bounds_ns=bounds),
        has_gpu=True,
    )
    return events, meta, streams(events, fault)


def _event(
    rank: int, name: str, category: str, cat: str, start: int, end: int, step: int,
    pid: int, tid: int, device: int | None = None,
) -> dict[str, object]:  # fmt: skip
    return {
        "rank": rank, "name": name, "category": category, "kineto_cat": cat, "ts_ns": start,
        "dur_ns": end - start, "pid": pid, "tid": tid, "device": device,
        "stream": tid if device is not None else None, "step": step,
    }  # fmt: skip


def streams(events: pa.Table, fault: RankFault) -> list[Series]:
    """What a 1 kHz sampler would have read on this rank's host."""
    start = int(events.column("ts_ns").to_numpy().min()) - 50 * MS
    end = int((events.column("ts_ns").to_numpy() + events.column("dur_ns").to_numpy()).max())
    ts = np.arange(start, end + 50 * MS, MS, dtype=np.int64)
    rng = np.random.default_rng(0)

    def running(name: str) -> np.ndarray:
        sel = events.filter(pa.compute.equal(events.column("name"), name))
        s = sel.column("ts_ns").to_numpy()
        e = s + sel.column("dur_ns").to_numpy()
        idx = np.searchsorted(s, ts, side="right") - 1
        return (idx >= 0) & (ts < e[np.maximum(idx, 0)])

    gemm, nccl, py = running(GEMM), running(NCCL), running(PY)
    sm = np.where(gemm, fault.sm_clock, 300.0) + rng.normal(0, 5, len(ts))  # idle clock 300
    nic_rate = np.where(nccl, fault.nic_gbps * 1e9, 1e6)  # bytes/s; a trickle when idle
    rx = np.cumsum(nic_rate * 1e-3 / 2)
    run = np.cumsum(np.where(py, fault.cpu_share * MS, 0.0))
    wait = np.cumsum(np.where(py, (1 - fault.cpu_share) * MS, 0.0))
    return [
        _series("sm_clock_mhz", "gpu0", False, ts, sm),
        _series("mem_clock_mhz", "gpu0", False, ts, np.full(len(ts), 1593.0)),
        _series("net_rx_bytes", "net:eth0", True, ts, rx),
        _series("net_tx_bytes", "net:eth0", True, ts, rx.copy()),
        _series("net_rx_bytes", "net:lo", True, ts, np.cumsum(np.full(len(ts), 5e5))),
        _series("net_tx_bytes", "net:lo", True, ts, np.cumsum(np.full(len(ts), 5e5))),
        _series("cpu_run_ns", "rank0", True, ts, run),
        _series("cpu_runqueue_wait_ns", "rank0", True, ts, wait),
    ]


def _series(metric: str, device: str, counter: bool, ts: np.ndarray, values: np.ndarray) -> Series:
    from array import array

    return Series(metric, device, counter, array("q", ts.tolist()), array("d", values.tolist()))


def analyze(faults: dict[int, RankFault]) -> tuple[list[pa.Table], object]:
    summaries, metas = [], {}
    for rank in range(4):
        events, meta, series = build_rank(rank, faults.get(rank, RankFault()))
        samples = hardware_table(series, meta)  # what the agent writes as hardware.parquet
        summaries.append(with_resources(summarize(events, meta), events, samples))
        metas[rank] = meta
    capture = Capture(
        source="synthetic", kind="capture", summary=pa.concat_tables(summaries), metas=metas
    )
    return summaries, analyze_capture(capture).verdict


def resource_of(summary: pa.Table, function: str) -> tuple[str | None, float | None]:
    row = next(r for r in summary.to_pylist() if r["function"] == function)
    return row["resource"], row["resource_mu"]


def test_governing_resource_is_measured_inside_executions_only() -> None:
    summaries, _ = analyze({})
    name, mu = resource_of(summaries[0], GEMM)
    assert name == "sm_clock_mhz" and mu == pytest.approx(1410, abs=5)  # idle 300 MHz removed
    name, mu = resource_of(summaries[0], NCCL)
    # Within one sample interval of the edges of each 30 ms collective (1 in 30): ±5%.
    assert name == "net_bytes_per_s" and mu == pytest.approx(12e9, rel=0.05)  # loopback ignored
    name, mu = resource_of(summaries[0], PY)
    assert name == "cpu_run_fraction" and mu == pytest.approx(0.98, abs=0.01)


def test_healthy_hardware_gives_no_finding() -> None:
    _, verdict = analyze({})
    assert verdict.status == "healthy", verdict.summary


def test_throttled_gpu_clock_is_gpu_hardware() -> None:
    # Slower clock: the kernel takes 1410/1100 × longer.
    _, verdict = analyze({2: RankFault(sm_clock=1100.0, gemm_ms=60.0 * 1410 / 1100)})
    top = verdict.findings[0]
    assert top.ranks == [2] and top.category == "gpu_hardware", verdict.summary
    assert "sm_clock_mhz" in verdict.summary


def test_one_slow_nic_is_network() -> None:
    _, verdict = analyze({1: RankFault(nic_gbps=4.0, nccl_ms=55.0)})
    assert verdict.findings, verdict.summary
    named = [f for f in verdict.findings if f.ranks == [1]]
    assert named and named[0].category == "network", verdict.to_json()


def test_noisy_neighbour_is_host() -> None:
    _, verdict = analyze({3: RankFault(cpu_share=0.5, python_ms=15.0)})
    top = verdict.findings[0]
    assert top.ranks == [3] and top.category == "host", verdict.to_json()


def test_software_cause_keeps_a_normal_resource() -> None:
    summaries, verdict = analyze({0: RankFault(python_ms=15.0)})
    _, mu = resource_of(summaries[0], PY)
    assert mu == pytest.approx(0.98, abs=0.01)
    top = verdict.findings[0]
    assert top.ranks == [0] and top.category == "python", verdict.to_json()


def test_oversubscribed_host_is_not_blamed_on_one_rank() -> None:
    # Every rank gets ~half a CPU (the job itself oversubscribes the host); rank 3 a bit less
    # by chance: no host finding (peers are not getting their CPU either).
    faults = {r: RankFault(cpu_share=0.5) for r in range(4)}
    faults[3] = RankFault(cpu_share=0.4)
    _, verdict = analyze(faults)
    assert not [f for f in verdict.findings if f.category == "host"], verdict.to_json()
