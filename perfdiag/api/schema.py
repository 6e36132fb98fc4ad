"""Columnar schemas of a capture (docs/design.md §3), versioned.

Every Parquet file perfdiag writes carries, in its Arrow schema metadata:
  b"perfdiag.schema" → the schema id below (e.g. b"perfdiag.summary/v1")
  b"perfdiag.worker" → `WorkerMeta` as JSON (rank, host, pod, the window it belongs to)

Each file's columns are declared once, with what each holds in its field metadata
(b"description"): EVENTS_COLUMNS, SUMMARY_COLUMNS, HARDWARE_COLUMNS (`column_descriptions` reads
them). The schemas tables are built with and files are written with (EVENTS_SCHEMA, …) are those
columns without their descriptions: a worker's summary.parquet is a few KB, read once per worker
by the cross-worker analysis, and the descriptions would add a quarter to every file.

Version rule: adding a nullable column keeps the version; renaming, removing or changing the
meaning of a column bumps it, and readers reject versions they do not know.
"""

from __future__ import annotations

import json
from typing import Literal, get_args

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from perfdiag.api.verdict import WorkCategory

EVENTS_SCHEMA_ID = "perfdiag.events/v1"
SUMMARY_SCHEMA_ID = "perfdiag.summary/v1"
HARDWARE_SCHEMA_ID = "perfdiag.hardware/v1"

META_SCHEMA = b"perfdiag.schema"
META_WORKER = b"perfdiag.worker"

Category = Literal[WorkCategory, "annotation", "other"]
"""An event's taxonomy category: a kind of work (perfdiag.api.verdict.WorkCategory),
`annotation` (a user's or the profiler's range, such as ProfilerStep#N, that its name does not
place) or `other`."""
CATEGORIES: tuple[Category, ...] = get_args(Category)
IDLE = "idle"
OTHER_FUNCTION = "<other>"
IDLE_FUNCTION = "<idle>"

DESCRIPTION = b"description"
"""The field-metadata key of a column's description."""


def _column(name: str, type_: pa.DataType, description: str) -> pa.Field:
    return pa.field(name, type_, metadata={DESCRIPTION: description.encode()})


def column_descriptions(schema: pa.Schema) -> dict[str, str]:
    """Each column of `schema` → its description ("" where it has none)."""
    return {field.name: (field.metadata or {}).get(DESCRIPTION, b"").decode() for field in schema}


def _stored(columns: pa.Schema) -> pa.Schema:
    """The columns as tables and files hold them: without their descriptions."""
    return pa.schema([field.remove_metadata() for field in columns])


_COLLECTIVE = (
    "of the collective call (record_param_comms, NCCL kernels, gloo annotations), else null"
)

EVENTS_COLUMNS = pa.schema(
    [
        _column("rank", pa.int32(), "global rank"),
        _column(
            "name", pa.string(), 'event name: kernel, aten op, Python frame "file.py(12): fn", …'
        ),
        _column(
            "category", pa.string(), "taxonomy category (docs/design.md §4): one of CATEGORIES"
        ),
        _column(
            "kineto_cat",
            pa.string(),
            'the source category as Kineto wrote it ("kernel", "cpu_op", …; "gc" for the '
            "hook's GC records)",
        ),
        _column("ts_ns", pa.int64(), "start, ns on the trace clock"),
        _column("dur_ns", pa.int64(), "duration, ns (≥ 0)"),
        _column("pid", pa.int64(), "Kineto pid: the process, or the GPU device for device events"),
        _column("tid", pa.int64(), "Kineto tid: the thread, or the stream for device events"),
        _column("device", pa.int32(), "GPU index for device events, null on the host"),
        _column("stream", pa.int64(), "CUDA stream for device events, null on the host"),
        _column(
            "step", pa.int32(), "index of the window step containing ts_ns (0-based), -1 outside"
        ),
        _column(
            "correlation", pa.int64(), "Kineto correlation id (launch ↔ kernel), null when absent"
        ),
        _column("collective", pa.string(), f"collective name {_COLLECTIVE}"),
        _column("msg_bytes", pa.int64(), f"bytes moved (input size) {_COLLECTIVE}"),
        _column("group_size", pa.int32(), f"process-group size {_COLLECTIVE}"),
        _column("pg_name", pa.string(), f"process-group name or id {_COLLECTIVE}"),
        _column(
            "seq",
            pa.int64(),
            "sequence number of that kind of call within its process group over the worker's "
            "whole trace, or Kineto's own Seq argument (the group's counter) where the trace has "
            f"it; {_COLLECTIVE}",
        ),
        _column(
            "dtype", pa.string(), f'element type as the profiler names it ("Float") {_COLLECTIVE}'
        ),
        _column(
            "pg_ranks",
            pa.string(),
            f'global ranks of the process group as Kineto writes them ("[0, 1]"; PyTorch may '
            f"shorten long lists) {_COLLECTIVE}",
        ),
        _column(
            "out_msg_bytes",
            pa.int64(),
            f"bytes output (Out msg nelems × element size) {_COLLECTIVE}",
        ),
    ]
)
"""events.parquet (perfdiag.events/v1): one row per complete event of the window."""
EVENTS_SCHEMA = _stored(EVENTS_COLUMNS)

SUMMARY_COLUMNS = pa.schema(
    [
        _column("rank", pa.int32(), "global rank"),
        _column(
            "function",
            pa.string(),
            'function name; "<idle>" for time nothing ran, "<other>" folds small ones',
        ),
        _column("category", pa.string(), 'taxonomy category, or "idle"'),
        _column("beta", pa.float64(), "time charged to it on the critical path / window time"),
        _column("time_ms", pa.float64(), "that charged time, ms, over the whole window"),
        _column("count", pa.int64(), "executions in the window"),
        _column("wall_ms", pa.float64(), "summed inclusive duration of its executions, ms"),
        _column("dur_median_us", pa.float64(), "median execution duration, µs"),
        _column("dur_p95_us", pa.float64(), "95th percentile execution duration, µs"),
        _column(
            "resource",
            pa.string(),
            'what governs it ("cpu", "bus_bandwidth_GBps", "sm_clock_MHz", …), or null',
        ),
        _column(
            "resource_mu", pa.float64(), "mean of that resource inside its executions, or null"
        ),
        _column("resource_sigma", pa.float64(), "standard deviation of that resource, or null"),
        _column(
            "beta_per_step",
            pa.list_(pa.float32()),
            "β within each window step (time charged / step duration)",
        ),
    ]
)
"""summary.parquet (perfdiag.summary/v1): one row per (function, category) of the worker, the
behavior pattern of docs/design.md §4. Small by construction: functions under a β floor are
folded into one OTHER_FUNCTION row per category."""
SUMMARY_SCHEMA = _stored(SUMMARY_COLUMNS)

HARDWARE_COLUMNS = pa.schema(
    [
        _column("rank", pa.int32(), "global rank of the worker the file belongs to"),
        _column(
            "ts_ns",
            pa.int64(),
            "when the sample was read: Unix-epoch ns of the host's real-time clock (the Kineto "
            "trace clock on the same host)",
        ),
        _column(
            "metric",
            pa.string(),
            '"sm_clock_mhz", "net_rx_bytes", "cpu_run_ns", … (docs/hardware.md)',
        ),
        _column(
            "device",
            pa.string(),
            '"gpu<i>" (NVML index), "net:<interface>", "cpu" / "cpu<n>", "rank<r>" (the '
            'worker\'s process), "host"',
        ),
        _column("value", pa.float64(), "the reading (counters as read: cumulative)"),
        _column(
            "counter",
            pa.bool_(),
            "true for cumulative counters (bytes, jiffies, ns): use differences",
        ),
    ]
)
"""hardware.parquet (perfdiag.hardware/v1): samples of the agent's hardware sampler
(perfdiag.collector.hardware) while the window was open; long format, one row per sample of one
metric of one device (docs/hardware.md lists the metrics, units and rates)."""
HARDWARE_SCHEMA = _stored(HARDWARE_COLUMNS)


class WindowMeta(BaseModel):
    """The captured window of one worker, on the trace clock."""

    model_config = ConfigDict(extra="forbid")

    id: str
    start_step: int = Field(description="Training step number at which the window began.")
    steps: int = Field(description="Steps analysed (the warm-up step of the window excluded).")
    step_bounds_ns: list[tuple[int, int]] = Field(
        description="[start, end) of each analysed step on the trace clock."
    )

    @property
    def step_times_ms(self) -> list[float]:
        return [(end - start) / 1e6 for start, end in self.step_bounds_ns]

    @property
    def span_ns(self) -> tuple[int, int]:
        return (self.step_bounds_ns[0][0], self.step_bounds_ns[-1][1])


class HostUsage(BaseModel):
    """How the worker's process used the host's CPUs in each analysed step, ms, from the agent's
    /proc and cgroup samples (collector/hardware.py; analyzer/signals/host_usage.py computes it).

    On-CPU, run-queue wait and the rest (off-CPU: asleep, blocked on I/O, a lock, a queue or a
    collective) add up to the step for the training thread."""

    model_config = ConfigDict(extra="forbid")

    main_run_ms: list[float] = Field(description="Training (main) thread on a CPU, per step.")
    main_wait_ms: list[float] = Field(
        description="Training thread runnable but not running (run queue, cgroup throttle)."
    )
    main_wait_communication_ms: list[float] | None = Field(
        default=None,
        description="The part of main_wait_ms while a collective was in flight (woken from a "
        "collective, waiting to run again): communication time, not the rank's own.",
    )
    process_cpu_ms: list[float] | None = Field(
        default=None, description="All of the process's threads on a CPU, per step."
    )
    torch_threads_cpu_ms: list[float] | None = Field(
        default=None,
        description="PyTorch's own threads of the process (named pt_*: the autograd engine's "
        "device threads, which run the backward pass of CUDA tensors, and the process groups' "
        "threads) on a CPU, per step: the rank's own work, never a competing thread.",
    )
    process_wait_ms: list[float] | None = Field(
        default=None, description="All threads' run-queue wait, per step."
    )
    children_cpu_ms: list[float] | None = Field(
        default=None,
        description="The process's child processes (DataLoader workers) on a CPU, per step.",
    )
    children_wait_ms: list[float] | None = Field(
        default=None, description="Its child processes' run-queue wait, per step."
    )
    exact_steps: bool = Field(
        default=False,
        description="main_run_ms and main_wait_ms (and process_cpu_ms where read) are the "
        "counters the hook read at each step boundary: exact per step. Otherwise they are "
        "interpolated between the agent's samples.",
    )
    sample_gap_p95_ms: float | None = Field(
        default=None,
        description="95th percentile of the gaps between the training thread's samples: per-step "
        "values are only as fine as this (a busy host delays the sampler too).",
    )
    threads: int | None = Field(default=None, description="Most threads the process had.")
    throttled_ms: list[float] | None = Field(
        default=None, description="Time the process's cgroup was throttled by its CPU quota."
    )
    cpu_quota_cores: float | None = Field(default=None, description="The cgroup's CPU limit.")
    host_runnable: float | None = Field(
        default=None, description="Mean runnable threads on the host (procs_running)."
    )
    host_cores: int | None = Field(default=None, description="CPUs of the host.")


class WorkerMeta(BaseModel):
    """Who produced a file: carried in every Parquet file's metadata."""

    model_config = ConfigDict(extra="forbid")

    rank: int
    world_size: int | None = None
    local_rank: int | None = None
    host: str | None = None
    pod: str | None = None
    pid: int | None = None
    window: WindowMeta
    torch_version: str | None = None
    source: Literal["hook", "kineto"] = "hook"
    source_file: str | None = None
    python_stacks: bool = False
    has_gpu: bool = False
    host_usage: HostUsage | None = None
    """CPU use of the worker's process per step (added in v1; absent without host samples)."""


def with_meta(schema: pa.Schema, schema_id: str, worker: WorkerMeta) -> pa.Schema:
    return schema.with_metadata(
        {META_SCHEMA: schema_id.encode(), META_WORKER: worker.model_dump_json().encode()}
    )


def read_meta(schema: pa.Schema, expected_id: str) -> WorkerMeta:
    """Check the schema id of a file and return its worker metadata."""
    meta = schema.metadata or {}
    found = meta.get(META_SCHEMA, b"").decode()
    if found != expected_id:
        raise ValueError(
            f"unsupported file schema {found or '<none>'!r}; this perfdiag reads {expected_id!r}"
        )
    return WorkerMeta.model_validate(json.loads(meta[META_WORKER]))
