"""Synthetic captures for the analyzer tests: realistic per-worker summaries of a synchronous
data-parallel job, with injected anomalies.

Model of one step: every rank does its work (functions below, each with a persistent per-rank
speed factor and per-step jitter); the collective completes when the slowest rank arrives, so
each rank's communication time is the transfer time plus its wait for the slowest rank. That
is what the engine's critical path charges on a real gloo job: the culprit shows more work, its
peers more communication.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from perfdiag.analyzer.load.capture import Capture
from perfdiag.api.schema import (
    SUMMARY_SCHEMA,
    SUMMARY_SCHEMA_ID,
    WindowMeta,
    WorkerMeta,
    with_meta,
)
from perfdiag.api.worker import WorkerStatus
from perfdiag.engine.parquet_io import table_to_bytes
from perfdiag.storage import Storage, layout
from perfdiag.storage.local import LocalStorage

COMM = "gloo:all_reduce"
PY_WAIT = "<built-in method wait of pybind11_builtins.pybind11_detail_function_record object>"

# (function, category, ms per step) of a healthy ~100 ms CPU DDP step (small MLP, gloo).
CPU_FUNCTIONS: list[tuple[str, str, float]] = [
    ("aten::addmm", "cpu_op", 24.0),
    ("aten::mm", "cpu_op", 16.0),
    ("aten::threshold_backward", "cpu_op", 3.0),
    ("aten::relu", "cpu_op", 2.5),
    ("aten::add_", "cpu_op", 4.0),
    ("aten::mse_loss_backward", "cpu_op", 1.5),
    ("<other>", "cpu_op", 3.0),
    ("train.py(41): forward", "python", 5.0),
    ("torch/nn/modules/module.py(1751): _call_impl", "python", 3.0),
    ("torch/optim/sgd.py(98): step", "python", 2.0),
    ("<other>", "python", 1.5),
    ("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "dataloader", 0.6),
    ("gc.collect(gen=0)", "gc", 0.1),
    ("<idle>", "idle", 0.8),
]
CPU_TRANSFER_MS = 9.0

GPU_FUNCTIONS: list[tuple[str, str, float]] = [
    ("sm80_xmma_gemm_bf16bf16_bf16f32", "gpu_compute", 60.0),
    ("flash_fwd_kernel", "gpu_compute", 18.0),
    ("elementwise_kernel", "gpu_compute", 6.0),
    ("Memcpy HtoD (Pinned -> Device)", "gpu_memory", 1.5),
    ("cudaLaunchKernel", "cuda_runtime", 0.5),
    ("<idle>", "idle", 1.0),
]
GPU_TRANSFER_MS = 8.0
GPU_COMM = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"
SM_CLOCK = "sm_clock_MHz"


@dataclass(frozen=True)
class Fault:
    """Extra ms per step of one function on some ranks (in some steps: None = all)."""

    ranks: Sequence[int]
    function: str
    category: str
    extra_ms: float
    steps: Sequence[int] | None = None
    clock_factor: float | None = None
    """GPU jobs: the function's SM clock on those ranks is scaled by this."""


@dataclass
class SyntheticJob:
    n_ranks: int = 4
    n_steps: int = 10
    seed: int = 0
    step_jitter: float = 0.08
    """Per (rank, step, function) multiplicative noise, uniform ± this."""
    rank_jitter: float = 0.05
    """Persistent per-rank speed, uniform ± this (heterogeneous hosts)."""
    faults: list[Fault] = field(default_factory=list)
    gpu: bool = False
    scale: dict[str, float] = field(default_factory=dict)
    """Per-category factors on the base times (a job-wide shape, e.g. a slow input pipeline)."""
    roles: dict[int, list[tuple[str, str, float]]] | None = None
    """rank → its own function list (ranks of different roles), overriding the base list."""
    python_wait_share: float | Sequence[float] = 0.0
    """Share of each rank's waiting that the profiler shows as a Python `wait` frame (c10d
    Work.wait) instead of inside the collective, as on real CPU jobs: one value (± half of it
    per rank) or one per rank."""

    def build(self) -> tuple[pa.Table, dict[int, WorkerMeta]]:
        rng = np.random.default_rng(self.seed)
        base = GPU_FUNCTIONS if self.gpu else CPU_FUNCTIONS
        per_rank_functions = [(self.roles or {}).get(r, base) for r in range(self.n_ranks)]
        names = sorted({(f, c) for fl in per_rank_functions for f, c, _ in fl})
        for fault in self.faults:
            if fault.category != "communication" and (fault.function, fault.category) not in names:
                names.append((fault.function, fault.category))
        index = {key: j for j, key in enumerate(names)}
        n_fn = len(names)
        base_ms = np.zeros((self.n_ranks, n_fn))
        for r, fl in enumerate(per_rank_functions):
            for f, c, v in fl:
                base_ms[r, index[(f, c)]] = v * self.scale.get(c, 1.0)
        speed = 1.0 + rng.uniform(-self.rank_jitter, self.rank_jitter, size=(self.n_ranks, 1, 1))
        noise = 1.0 + rng.uniform(
            -self.step_jitter, self.step_jitter, size=(self.n_ranks, self.n_steps, n_fn)
        )
        work = base_ms[:, None, :] * speed * noise  # (R, S, F)
        clock = np.full((self.n_ranks, n_fn), np.nan)
        if self.gpu:
            for (_, c), j in index.items():
                if c == "gpu_compute":
                    clock[:, j] = 1980.0 + rng.normal(0, 8, self.n_ranks)
        for fault in self.faults:
            if fault.category == "communication":
                continue  # applied after the collective completes, below
            j = index[(fault.function, fault.category)]
            steps = list(range(self.n_steps)) if fault.steps is None else list(fault.steps)
            for r in fault.ranks:
                work[r, steps, j] += fault.extra_ms
                if fault.clock_factor is not None:
                    clock[r, j] *= fault.clock_factor
        busy = work.sum(axis=2)  # everything outside the collective, idle gaps included
        transfer = (GPU_TRANSFER_MS if self.gpu else CPU_TRANSFER_MS) * (
            1.0 + rng.uniform(-self.step_jitter, self.step_jitter, size=self.n_steps)
        )
        step_ms = busy.max(axis=0) + transfer  # (S,) the collective waits for the slowest
        comm_ms = step_ms[None, :] - busy  # (R, S)
        step_ms = np.broadcast_to(step_ms, (self.n_ranks, self.n_steps)).copy()
        for fault in self.faults:
            if fault.category == "communication":
                # A rank's own slower communication (not a wait for others): its step grows.
                steps = list(range(self.n_steps)) if fault.steps is None else list(fault.steps)
                for r in fault.ranks:
                    comm_ms[r, steps] += fault.extra_ms
                    step_ms[r, steps] += fault.extra_ms
        comm_name = GPU_COMM if self.gpu else COMM
        if isinstance(self.python_wait_share, float | int):
            jitter = 1 + rng.uniform(-0.5, 0.5, size=(self.n_ranks, 1))
            share = self.python_wait_share * jitter
        else:
            share = np.asarray(self.python_wait_share, dtype=float)[:, None]
        wait_ms = comm_ms * share
        all_names = [*names, (comm_name, "communication"), (PY_WAIT, "python")]
        ms = np.concatenate(
            [work, (comm_ms - wait_ms)[:, :, None], wait_ms[:, :, None]], axis=2
        )  # (R, S, F+2)
        clock = np.concatenate([clock, np.full((self.n_ranks, 2), np.nan)], axis=1)
        return _tables(ms, step_ms, all_names, clock, self.gpu)


def _tables(
    ms: np.ndarray,
    step_ms: np.ndarray,
    names: list[tuple[str, str]],
    clock: np.ndarray,
    gpu: bool,
) -> tuple[pa.Table, dict[int, WorkerMeta]]:
    n_ranks, n_steps, _ = ms.shape
    window_ms = step_ms.sum(axis=1)  # (R,)
    present = ms.sum(axis=1) > 0  # (R, F)
    r_idx, f_idx = np.nonzero(present)
    time_ms = ms.sum(axis=1)[r_idx, f_idx]
    per_step = (ms / step_ms[:, :, None])[r_idx, :, f_idx].astype(np.float32)
    has_clock = ~np.isnan(clock[r_idx, f_idx])
    table = pa.table(
        {
            "rank": pa.array(r_idx, pa.int32()),
            "function": pa.array([names[j][0] for j in f_idx], pa.string()),
            "category": pa.array([names[j][1] for j in f_idx], pa.string()),
            "beta": pa.array(time_ms / window_ms[r_idx], pa.float64()),
            "time_ms": pa.array(time_ms, pa.float64()),
            "count": pa.array(np.full(len(r_idx), 3 * n_steps), pa.int64()),
            "wall_ms": pa.array(time_ms * 1.1, pa.float64()),
            "dur_median_us": pa.array(time_ms / (3 * n_steps) * 1000, pa.float64()),
            "dur_p95_us": pa.array(time_ms / (3 * n_steps) * 1500, pa.float64()),
            "resource": pa.array(np.where(has_clock, SM_CLOCK, None), pa.string()),
            "resource_mu": pa.array(clock[r_idx, f_idx], pa.float64(), from_pandas=True),
            "resource_sigma": pa.array(
                np.where(has_clock, 15.0, np.nan), pa.float64(), from_pandas=True
            ),
            "beta_per_step": pa.ListArray.from_arrays(
                pa.array(np.arange(len(r_idx) + 1, dtype=np.int32) * n_steps),
                pa.array(per_step.reshape(-1), pa.float32()),
            ),
        },
        schema=SUMMARY_SCHEMA,
    )
    metas = {}
    for r in range(n_ranks):
        bounds_ns = np.concatenate([[0], np.cumsum(step_ms[r] * 1e6)]).astype(np.int64)
        offset = 1_000_000_000 * (r + 1)  # every rank has its own trace clock
        metas[r] = WorkerMeta(
            rank=r,
            world_size=n_ranks,
            local_rank=r,
            host=f"host-{r // 8}",
            window=WindowMeta(
                id="w1",
                start_step=6,
                steps=n_steps,
                step_bounds_ns=[
                    (int(offset + bounds_ns[s]), int(offset + bounds_ns[s + 1]))
                    for s in range(n_steps)
                ],
            ),
            has_gpu=gpu,
        )
    return table, metas


def capture_of(
    table: pa.Table,
    metas: dict[int, WorkerMeta],
    statuses: dict[int, WorkerStatus] | None = None,
    drop: Sequence[int] = (),
) -> Capture:
    """An in-memory Capture (what load_capture returns), without ranks in `drop`."""
    keep = [r for r in sorted(metas) if r not in drop]
    rank_col = table.column("rank").to_numpy()
    mask = np.isin(rank_col, keep)
    return Capture(
        source="memory://test",
        kind="capture",
        summary=table.filter(pa.array(mask)),
        metas={r: metas[r] for r in keep},
        statuses=dict(statuses or {}),
    )


def write_capture(
    storage: Storage,
    table: pa.Table,
    metas: dict[int, WorkerMeta],
    *,
    drop: Sequence[int] = (),
    statuses: dict[int, WorkerStatus] | None = None,
) -> None:
    """Write the docs/design.md §3 layout: summary.parquet + status.json per worker."""
    rank_col = table.column("rank").to_numpy()
    now = 1_700_000_000.0
    for rank, meta in metas.items():
        status = (statuses or {}).get(rank)
        if rank not in drop:
            part = table.filter(pa.array(rank_col == rank))
            part = part.replace_schema_metadata(None).cast(
                with_meta(SUMMARY_SCHEMA, SUMMARY_SCHEMA_ID, meta)
            )
            storage.put_bytes(layout.worker_key(rank, layout.SUMMARY), table_to_bytes(part))
            status = status or WorkerStatus(
                rank=rank,
                host=meta.host,
                plan_id="w1",
                phase="done",
                step=30,
                last_step_unix=now,
                updated_unix=now,
                files=[layout.worker_key(rank, layout.SUMMARY)],
            )
        if status is not None:
            storage.put_text(layout.worker_key(rank, layout.STATUS), status.model_dump_json())
    storage.put_text(
        layout.PLAN,
        json.dumps(
            {
                "id": "w1",
                "action": "capture",
                "steps": 10,
                "activities": ["cpu"],
                "python_stacks": True,
                "deadline": "2030-01-01T00:00:00Z",
            }
        ),
    )


@pytest.fixture
def local_storage(tmp_path: Path) -> LocalStorage:
    return LocalStorage(tmp_path / "capture")


# ----------------------------------------------------------------- browser ----
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_binary() -> str:
    """Debian's chromium (or PERFDIAG_CHROMIUM). Missing → the test FAILS saying so."""
    import os
    import shutil

    found = os.environ.get("PERFDIAG_CHROMIUM") or next(
        (
            p
            for name in ("chromium", "chromium-browser", "google-chrome")
            if (p := shutil.which(name))
        ),
        None,
    )
    if not found:
        pytest.fail(
            "report rendering tests need headless Chromium: apt-get install chromium, or set "
            "PERFDIAG_CHROMIUM to a Chromium/Chrome binary",
            pytrace=False,
        )
    return found


def run_chromium(html: Path, work: Path, *args: str) -> str:
    """Run headless Chromium on a local file with a fresh profile; return its stdout."""
    import subprocess

    profile = work / f"profile-{len(list(work.glob('profile-*')))}"
    result = subprocess.run(
        [chromium_binary(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args, html.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(f"chromium exited {result.returncode}: {result.stderr[-2000:]}")
    return result.stdout
