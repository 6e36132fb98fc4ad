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
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from perfdiag.analyzer.load.capture import Capture
from perfdiag.analyzer.pipeline import analyze_capture
from perfdiag.analyzer.report.verdict import verdict_of
from perfdiag.api.schema import EVENTS_SCHEMA, WindowMeta, WorkerMeta
from perfdiag.api.verdict import Verdict
from perfdiag.collector.hardware import Series, hardware_table
from perfdiag.engine.hardware_samples import with_resources
from perfdiag.engine.summary import summarize

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
    throttle: int = 0
    """NVML clock-throttle reason bits while its kernels run (the idle bit is set outside)."""
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
        _series("clock_throttle_reasons", "gpu0", False, ts, np.where(gemm, fault.throttle, 1)),
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


def analyze(faults: dict[int, RankFault]) -> tuple[list[pa.Table], Verdict]:
    summaries, metas, hardware = [], {}, {}
    for rank in range(4):
        events, meta, series = build_rank(rank, faults.get(rank, RankFault()))
        samples = hardware_table(series, meta)  # what the agent writes as hardware.parquet
        summaries.append(with_resources(summarize(events, meta), events, samples))
        metas[rank] = meta
        hardware[rank] = samples
    capture = Capture(
        source="synthetic", kind="capture", summary=pa.concat_tables(summaries), metas=metas
    )
    return summaries, verdict_of(analyze_capture(capture, read_hardware=hardware.get))


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


@pytest.mark.parametrize(
    ("bits", "reason", "next_step"),
    [
        (0x40, "hardware thermal slowdown in 100%", "too hot"),
        (0x20, "software thermal slowdown in 100%", "too hot"),
        (0x4, "software power cap in 100%", "power limit"),
        (0x80 | 0x8, "hardware power brake in 100%", "power limit"),
    ],
)
def test_a_throttled_gpu_says_whether_heat_or_power_held_its_clock(
    bits: int, reason: str, next_step: str
) -> None:
    fault = RankFault(sm_clock=1100.0, gemm_ms=60.0 * 1410 / 1100, throttle=bits)
    _, verdict = analyze({2: fault, 0: RankFault(throttle=0x10)})  # rank 0: sync boost, no harm
    blamed = [f for f in verdict.findings if f.category == "gpu_hardware"]
    assert blamed and all(f.ranks == [2] for f in blamed), verdict.to_json()
    for finding in blamed:
        assert f"rank 2: {reason}" in finding.message, finding.message
        assert "of its busy samples" in finding.message
        assert next_step in finding.message.partition(" Next: ")[2], finding.message
        shares = finding.evidence["throttle_reasons"]["2"]["shares"]
        assert all(share == 1.0 for share in shares.values()), shares


def test_a_slow_gpu_clock_without_a_throttle_reason_says_so() -> None:
    _, verdict = analyze({2: RankFault(sm_clock=1100.0, gemm_ms=60.0 * 1410 / 1100)})
    top = verdict.findings[0]
    assert top.category == "gpu_hardware", verdict.to_json()
    assert "NVML reported no clock-throttle reason while it was busy" in top.message
    assert top.evidence["throttle_reasons"]["2"]["shares"] == {}


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


def test_analyze_reads_the_blamed_ranks_hardware_files_from_storage(tmp_path: Path) -> None:
    """Through `analyze(storage)`: the capture's hardware.parquet of the blamed rank gives the
    reasons; an unreadable one is a note, and the finding stays."""
    from perfdiag.analyzer import analyze as analyze_storage
    from perfdiag.engine.parquet_io import table_to_bytes
    from perfdiag.storage import layout
    from perfdiag.storage.local import LocalStorage
    from tests.analyzer.conftest import write_capture

    faults = {2: RankFault(sm_clock=1100.0, gemm_ms=60.0 * 1410 / 1100, throttle=0x4)}
    storage = LocalStorage(tmp_path)
    summaries, metas = [], {}
    for rank in range(4):
        events, meta, series = build_rank(rank, faults.get(rank, RankFault()))
        samples = hardware_table(series, meta)
        summaries.append(with_resources(summarize(events, meta), events, samples))
        metas[rank] = meta
        storage.put_bytes(layout.worker_key(rank, layout.HARDWARE), table_to_bytes(samples))
    write_capture(storage, pa.concat_tables(summaries), metas)

    top = analyze_storage(storage).findings[0]
    assert top.category == "gpu_hardware" and top.ranks == [2]
    assert "software power cap in 100%" in top.message, top.message
    assert top.evidence["throttle_reasons"]["2"]["shares"] == {"sw_power_cap": 1.0}

    storage.put_bytes(layout.worker_key(2, layout.HARDWARE), b"PAR1 not parquet")
    verdict = analyze_storage(storage)
    top = verdict.findings[0]
    assert top.category == "gpu_hardware" and "throttle_reasons" not in top.evidence
    report = storage.get_text(layout.REPORT)
    assert "rank 2: workers/2/hardware.parquet not read" in report
