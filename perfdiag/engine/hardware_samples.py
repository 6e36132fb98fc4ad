"""μ/σ of each function's governing resource, from hardware.parquet samples taken inside its
executions (docs/design.md §4 "Behavior pattern").

The agent calls `with_resources(summary, events, hardware)` when it writes a worker's summary,
so the cross-worker stage (analyzer/signals/hardware.py) compares small numbers, never samples.

| category of the function | governing resource | from |
| --- | --- | --- |
| gpu_compute | `sm_clock_mhz` (lower is worse) | NVML SM clock of the worker's GPU |
| gpu_memory | `gpu_mem_clock_mhz` | NVML memory clock |
| communication | `net_bytes_per_s` (lower is worse) | NIC byte counters (/proc/net/dev), rx + tx of the interfaces that carried traffic during the window; loopback never counts (it is not a link, and all ranks of a host share it) |
| python, cpu_op, dataloader, gc, cuda_runtime, annotation, other | `cpu_run_fraction` (lower is worse) | the worker's main thread: run time / (run time + run-queue wait), /proc/<pid>/schedstat |

"Inside its executions": the union of the function's execution intervals in the window; a
gauge sample counts when its timestamp is inside, a counter's rate (Δ value / Δ time between
two consecutive samples) when the midpoint of the two is inside. Idle gaps between executions
are thereby removed, and so are intervals in which the thread was not runnable at all (no run,
no wait: asleep, e.g. blocked in a collective) for the CPU resource. Fewer than
`MIN_SAMPLES` samples inside: no μ/σ (the function ran too briefly to say).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from perfdiag.api import taxonomy

MIN_SAMPLES = 3
LOOPBACK = frozenset({"net:lo"})
HOST_CATEGORIES = frozenset(
    {"python", "cpu_op", "dataloader", "gc", "cuda_runtime", "annotation", "other"}
)
RESOURCE_OF_CATEGORY = {
    "gpu_compute": "sm_clock_mhz",
    "gpu_memory": "gpu_mem_clock_mhz",
    "communication": "net_bytes_per_s",
    **dict.fromkeys(HOST_CATEGORIES, "cpu_run_fraction"),
}


@dataclass(frozen=True)
class Signal:
    """A resource as points in time: gauge samples, or counter rates at interval midpoints,
    with the weight each point carries in μ/σ (1 for a gauge sample; the interval's length for
    a rate, so that μ is total bytes / total time; the runnable time for the CPU share)."""

    at_ns: NDArray[np.int64]
    value: NDArray[np.float64]
    weight: NDArray[np.float64]


def resource_signals(hardware: pa.Table) -> dict[str, Signal]:
    """The governing resources one worker's samples can give."""
    signals: dict[str, Signal] = {}
    if hardware.num_rows == 0:
        return signals
    for metric, name in (("sm_clock_mhz", "sm_clock_mhz"), ("mem_clock_mhz", "gpu_mem_clock_mhz")):
        rows = _rows(hardware, metric)
        if rows.num_rows:
            # One GPU per worker file; with several, their samples interleave in time.
            signals[name] = _gauge(rows)
    net = _network(hardware)
    if net is not None:
        signals["net_bytes_per_s"] = net
    cpu = _cpu_run_fraction(hardware)
    if cpu is not None:
        signals["cpu_run_fraction"] = cpu
    return signals


def _rows(hardware: pa.Table, metric: str, device: str | None = None) -> pa.Table:
    mask = pc.equal(hardware.column("metric"), metric)
    if device is not None:
        mask = pc.and_(mask, pc.equal(hardware.column("device"), device))
    return hardware.filter(mask).sort_by("ts_ns")


def _gauge(rows: pa.Table) -> Signal:
    value = rows.column("value").to_numpy().astype(np.float64)
    return Signal(rows.column("ts_ns").to_numpy().astype(np.int64), value, np.ones(len(value)))


def _rate(rows: pa.Table) -> Signal:
    ts = rows.column("ts_ns").to_numpy().astype(np.int64)
    value = rows.column("value").to_numpy().astype(np.float64)
    dt = np.diff(ts)
    keep = dt > 0
    mid = (ts[:-1] + dt // 2)[keep]
    return Signal(mid, np.diff(value)[keep] / (dt[keep] / 1e9), dt[keep].astype(np.float64))


def _network(hardware: pa.Table) -> Signal | None:
    """Bytes per second through the interfaces that carried traffic (rx + tx)."""
    net = hardware.filter(pc.starts_with(hardware.column("device"), "net:"))
    if net.num_rows == 0:
        return None
    devices = pc.unique(net.column("device")).to_pylist()
    moved: dict[str, Signal] = {}
    for device in devices:
        parts = [_rate(_rows(net, m, device)) for m in ("net_rx_bytes", "net_tx_bytes")]
        if any(len(p.at_ns) == 0 for p in parts) or len(parts[0].at_ns) != len(parts[1].at_ns):
            continue
        total = Signal(parts[0].at_ns, parts[0].value + parts[1].value, parts[0].weight)
        if np.nansum(total.value) > 0:
            moved[device] = total
    # Loopback is memory copies between processes of one host, not a link: it says nothing
    # about a NIC, and every rank of the host sees the same counter.
    chosen = [d for d in moved if d not in LOOPBACK]
    if not chosen:
        return None
    # Interfaces are sampled together (one read of /proc/net/dev): same timestamps.
    first = moved[chosen[0]]
    total = np.sum([moved[d].value for d in chosen], axis=0)
    return Signal(first.at_ns, total, first.weight)


def _cpu_run_fraction(hardware: pa.Table) -> Signal | None:
    run = _rows(hardware, "cpu_run_ns")
    wait = _rows(hardware, "cpu_runqueue_wait_ns")
    if run.num_rows < 2 or run.num_rows != wait.num_rows:
        return None
    ts = run.column("ts_ns").to_numpy().astype(np.int64)
    d_run = np.diff(run.column("value").to_numpy().astype(np.float64))
    d_wait = np.diff(wait.column("value").to_numpy().astype(np.float64))
    runnable = d_run + d_wait
    dt = np.diff(ts)
    keep = (runnable > 0) & (dt > 0)
    # The kernel adds run time at ticks and context switches, and a wait when the wait ends:
    # one 1 ms interval says little, so each counts by its runnable time (μ = Σ run / Σ
    # runnable over the function's executions).
    share = d_run / np.where(keep, runnable, 1.0)
    return Signal((ts[:-1] + dt // 2)[keep], share[keep], runnable[keep])


def inside(
    at_ns: NDArray[np.int64], starts: NDArray[np.int64], ends: NDArray[np.int64]
) -> NDArray[np.bool_]:
    """Which points lie in the union of [start, end) intervals (any order, may overlap)."""
    if len(starts) == 0 or len(at_ns) == 0:
        return np.zeros(len(at_ns), dtype=bool)
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)  # the furthest end of the intervals started so far
    idx = np.searchsorted(s, at_ns, side="right") - 1
    valid = idx >= 0
    result = np.zeros(len(at_ns), dtype=bool)
    result[valid] = at_ns[valid] < reach[idx[valid]]
    return result


def with_resources(summary: pa.Table, events: pa.Table, hardware: pa.Table | None) -> pa.Table:
    """The summary with `resource`, `resource_mu`, `resource_sigma` filled where the samples
    allow; the file metadata is kept."""
    if hardware is None or hardware.num_rows == 0 or events.num_rows == 0:
        return summary
    signals = resource_signals(hardware)
    if not signals:
        return summary
    functions = taxonomy.function_names(events["name"])
    key = pc.binary_join_element_wise(functions, events.column("category"), "\x1f")
    encoded = pc.dictionary_encode(key).combine_chunks()
    codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    lookup = {k: i for i, k in enumerate(encoded.dictionary.to_pylist())}
    start = events.column("ts_ns").to_numpy().astype(np.int64)
    end = start + events.column("dur_ns").to_numpy().astype(np.int64)
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(len(lookup) + 1))

    names = summary.column("function").to_pylist()
    cats = summary.column("category").to_pylist()
    resource: list[str | None] = []
    mu = np.full(len(names), np.nan)
    sigma = np.full(len(names), np.nan)
    for row, (function, category) in enumerate(zip(names, cats, strict=True)):
        name = RESOURCE_OF_CATEGORY.get(category)
        code = lookup.get(f"{function}\x1f{category}")
        signal = signals.get(name) if name else None
        if signal is None or code is None:
            resource.append(None)
            continue
        members = order[bounds[code] : bounds[code + 1]]
        chosen = inside(signal.at_ns, start[members], end[members])
        values, weights = signal.value[chosen], signal.weight[chosen]
        finite = np.isfinite(values) & (weights > 0)
        values, weights = values[finite], weights[finite]
        if len(values) < MIN_SAMPLES:
            resource.append(None)
            continue
        resource.append(name)
        mean = float(np.average(values, weights=weights))
        mu[row] = mean
        sigma[row] = float(np.sqrt(np.average((values - mean) ** 2, weights=weights)))
    metadata = summary.schema.metadata
    table = summary.set_column(
        summary.schema.get_field_index("resource"), "resource", pa.array(resource, pa.string())
    )
    for column, data in (("resource_mu", mu), ("resource_sigma", sigma)):
        table = table.set_column(
            table.schema.get_field_index(column),
            column,
            pa.array(data, pa.float64(), mask=np.isnan(data)),
        )
    return table.replace_schema_metadata(metadata)
