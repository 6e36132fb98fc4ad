"""Columnar schemas of a capture (docs/design.md §3), versioned.

Every Parquet file perfdiag writes carries, in its Arrow schema metadata:
  b"perfdiag.schema" → the schema id below (e.g. b"perfdiag.summary/v1")
  b"perfdiag.worker" → `WorkerMeta` as JSON (rank, host, pod, the window it belongs to)

Version rule: adding a nullable column keeps the version; renaming, removing or changing the
meaning of a column bumps it, and readers reject versions they do not know.

events.parquet  (perfdiag.events/v1) — one row per complete event of the window
  rank          int32    global rank
  name          string   event name (kernel, aten op, Python frame "file.py(12): fn", …)
  category      string   taxonomy category (docs/design.md §4): one of `CATEGORIES` below
  kineto_cat    string   the source category as Kineto wrote it ("kernel", "cpu_op", …; "gc"
                         for the hook's own GC records)
  ts_ns         int64    start, nanoseconds on the trace clock
  dur_ns        int64    duration, nanoseconds (≥ 0)
  pid           int64    Kineto pid (process, or GPU device for device events)
  tid           int64    Kineto tid (thread, or stream for device events)
  device        int32    GPU index for device events, null on the host
  stream        int64    CUDA stream for device events, null on the host
  step          int32    index of the window step containing ts_ns (0-based), -1 outside
  correlation   int64    Kineto correlation id (launch ↔ kernel), null when absent
  collective    string   collective name from record_param_comms / NCCL kernels, else null
  msg_bytes     int64    bytes moved by that collective (input size), else null
  group_size    int32    process-group size of that collective, else null
  pg_name       string   process-group name/id, else null
  seq           int64    collective sequence number within its group, else null: the order of
                         that kind of call (record_param_comms op, NCCL kernel, gloo annotation)
                         within its process group over the worker's whole trace, or Kineto's
                         own `Seq` argument (the process group's counter) where the trace has it
  dtype         string   element type of that collective as the profiler names it ("Float"), else
                         null (added in v1, nullable)
  pg_ranks      string   global ranks of its process group as Kineto writes them ("[0, 1]"; PyTorch
                         may shorten long lists), else null (added in v1, nullable)
  out_msg_bytes int64    bytes that collective outputs (`Out msg nelems` × element size), else null
                         (added in v1, nullable)

summary.parquet (perfdiag.summary/v1) — one row per (function, category) of the worker: the
behavior pattern of docs/design.md §4. Small by construction: functions under a β floor are folded
into one "<other>" row per category.
  rank            int32
  function        string   function name ("<idle>" for time nothing ran, category "idle")
  category        string   taxonomy category, or "idle"
  beta            float64  time charged to it on the critical path / window time
  time_ms         float64  that charged time, ms, over the whole window
  count           int64    executions in the window
  wall_ms         float64  summed inclusive duration of its executions, ms
  dur_median_us   float64  median execution duration, µs
  dur_p95_us      float64  95th percentile execution duration, µs
  resource        string   what governs it ("cpu", "bus_bandwidth_GBps", "sm_clock_MHz"…), or null
  resource_mu     float64  mean of that resource inside its executions, or null
  resource_sigma  float64  standard deviation of it, or null
  beta_per_step   list<float32>  β within each window step (time charged / step duration)

hardware.parquet (perfdiag.hardware/v1) — samples taken by the agent's hardware sampler
(perfdiag.collector.hardware) while the window was open; long format, one row per sample of
one metric of one device (docs/hardware.md lists the metrics, units and rates).
  rank      int32    global rank of the worker the file belongs to
  ts_ns     int64    when the sample was read: Unix-epoch ns of the host's real-time clock
                     (the Kineto trace clock on the same host)
  metric    string   "sm_clock_mhz", "net_rx_bytes", "cpu_run_ns", …
  device    string   "gpu<i>" (NVML index), "net:<interface>", "cpu" / "cpu<n>", "rank<r>" (the
                     worker's process), "host"
  value     float64  the reading (counters as read: cumulative)
  counter   bool     true for cumulative counters (bytes, jiffies, ns): use differences
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

EVENTS_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),
        ("name", pa.string()),
        ("category", pa.string()),
        ("kineto_cat", pa.string()),
        ("ts_ns", pa.int64()),
        ("dur_ns", pa.int64()),
        ("pid", pa.int64()),
        ("tid", pa.int64()),
        ("device", pa.int32()),
        ("stream", pa.int64()),
        ("step", pa.int32()),
        ("correlation", pa.int64()),
        ("collective", pa.string()),
        ("msg_bytes", pa.int64()),
        ("group_size", pa.int32()),
        ("pg_name", pa.string()),
        ("seq", pa.int64()),
        ("dtype", pa.string()),
        ("pg_ranks", pa.string()),
        ("out_msg_bytes", pa.int64()),
    ]
)

SUMMARY_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),
        ("function", pa.string()),
        ("category", pa.string()),
        ("beta", pa.float64()),
        ("time_ms", pa.float64()),
        ("count", pa.int64()),
        ("wall_ms", pa.float64()),
        ("dur_median_us", pa.float64()),
        ("dur_p95_us", pa.float64()),
        ("resource", pa.string()),
        ("resource_mu", pa.float64()),
        ("resource_sigma", pa.float64()),
        ("beta_per_step", pa.list_(pa.float32())),
    ]
)


HARDWARE_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),
        ("ts_ns", pa.int64()),
        ("metric", pa.string()),
        ("device", pa.string()),
        ("value", pa.float64()),
        ("counter", pa.bool_()),
    ]
)


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
