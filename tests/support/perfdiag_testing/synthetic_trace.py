"""Synthetic GPU Kineto traces: N ranks of a data-parallel (optionally pipelined) training job,
written as the Chrome-trace JSON torch.profiler exports, with injectable faults.

What a file holds (one per rank, `rank-<r>.json.gz`): `distributedInfo` (rank, world size),
`deviceProperties`, and `traceEvents` with, per step,
  * a `ProfilerStep#N` user annotation around the step on the main thread;
  * a DataLoader range, a Python frame (`train.py(59): tokenize`), an HtoD memcpy;
  * forward and backward `cpu_op`s each launching a kernel through `cudaLaunchKernel`
    (`cuda_runtime`), the kernel on GPU stream 7 with an `ac2g` flow (correlation id);
  * DDP gradient buckets: `record_param_comms` (collective args: name, message size, dtype,
    process group name and ranks, group size) launching `ncclDevKernel_AllReduce_…` on stream
    20, which runs from the rank's arrival until the last rank of the group has arrived plus the
    transfer time; pipelined jobs add a `ncclDevKernel_SendRecv` between the two stages;
  * the optimizer (`multi_tensor_apply_kernel`, after the last bucket) and a
    `cudaDeviceSynchronize` that ends the step.

Ranks are simulated in lock step (collective by collective) so waiting is real: a late rank
makes its group wait; a slow link (one rank's transfers slower) delays that rank's next
arrival. Faults (`TraceFault`): see FAULT_KINDS.

The simulation runs twice: once for all ranks keeping only collective times, then per rank
to write its file with those times — so 1,000 ranks are generated with bounded memory.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

FaultKind = Literal[
    "throttled_gpu",
    "slow_link",
    "compute_straggler",
    "python_hotspot",
    "launch_gaps",
    "memcpy_anomaly",
]
FAULT_KINDS: dict[str, str] = {
    "throttled_gpu": "every kernel of the rank runs `factor`× longer (a clock-throttled GPU)",
    "slow_link": "the rank's collective transfers take `factor`× longer; its peers then wait "
    "for it at its next (late) arrival",
    "compute_straggler": "the rank's attention kernels run `factor`× longer (more work: "
    "longer sequences), other kernels unchanged",
    "python_hotspot": "`extra_ms` of Python (train.py(59): tokenize) per step before the "
    "forward pass",
    "launch_gaps": "each cudaLaunchKernel takes `extra_ms` longer (host-bound launches: the GPU "
    "idles between kernels)",
    "memcpy_anomaly": "the rank's HtoD input copy runs `factor`× longer (pageable memory, a "
    "degraded PCIe link)",
}

EPOCH_US = 1_750_000_000_000_000.0
MAIN_TID = 100
COMPUTE_STREAM = 7
COMM_STREAM = 20

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1"
GEMM_BWD = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n_tilesize128x256x64_warpgroupsize2x1x1"
ATTENTION = "flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, bf16>>"
ATTENTION_BWD = "flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128>>"
ELEMENTWISE = "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>"
OPTIMIZER = "void at::native::multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor>"
ALLREDUCE = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
SENDRECV = "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)"
MEMCPY = "Memcpy HtoD (Pinned -> Device)"
HOTSPOT = "train.py(59): tokenize"
DATALOADER = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"

# (cpu op, kernel, µs) of one transformer layer, forward and backward.
FORWARD: tuple[tuple[str, str, float], ...] = (
    ("aten::mm", GEMM, 420.0),
    ("aten::_flash_attention_forward", ATTENTION, 260.0),
    ("aten::mm", GEMM, 380.0),
    ("aten::gelu", ELEMENTWISE, 60.0),
)
BACKWARD: tuple[tuple[str, str, float], ...] = (
    ("aten::mm", GEMM_BWD, 820.0),
    ("aten::_flash_attention_backward", ATTENTION_BWD, 540.0),
    ("aten::mm", GEMM_BWD, 760.0),
    ("aten::gelu_backward", ELEMENTWISE, 90.0),
)


@dataclass(frozen=True)
class TraceFault:
    kind: FaultKind
    ranks: tuple[int, ...]
    factor: float = 1.0
    extra_ms: float = 0.0


@dataclass
class TraceJob:
    """A synthetic job. Defaults: ~25 ms steps, ~10% exposed communication."""

    n_ranks: int = 8
    n_steps: int = 8
    seed: int = 0
    layers: int = 6
    layers_per_bucket: int = 2
    bucket_mb: float = 50.0
    """Gradient bytes per DDP bucket (bf16)."""
    link_gbps: float = 80.0
    """Bus bandwidth of the collectives (GB/s)."""
    step_jitter: float = 0.03
    rank_jitter: float = 0.02
    clock_skew_us: float = 0.0
    """Per-rank trace clock offset, uniform ± this (hosts' clocks are not perfectly aligned)."""
    pipeline_stages: int = 1
    """>1: ranks are split into consecutive stages; each stage has its own DP group."""
    stage_layers: tuple[int, ...] = ()
    """Layers per stage (imbalanced pipelines); default `layers` each."""
    faults: list[TraceFault] = field(default_factory=list)

    # ------------------------------------------------------------------ topology --
    def stage_of(self, rank: int) -> int:
        per = self.n_ranks // self.pipeline_stages
        return min(rank // per, self.pipeline_stages - 1)

    def layers_of(self, rank: int) -> int:
        stage = self.stage_of(rank)
        return self.stage_layers[stage] if self.stage_layers else self.layers

    def dp_group(self, rank: int) -> tuple[str, tuple[int, ...]]:
        stage = self.stage_of(rank)
        members = tuple(r for r in range(self.n_ranks) if self.stage_of(r) == stage)
        return (str(stage), members)

    def p2p_group(self, rank: int) -> tuple[str, tuple[int, ...]] | None:
        """Pipelines: the rank's partner in the neighbouring stage (pairs across stages 0↔1,
        2↔3, …)."""
        if self.pipeline_stages < 2:
            return None
        per = self.n_ranks // self.pipeline_stages
        stage = self.stage_of(rank)
        partner_stage = stage + 1 if stage % 2 == 0 else stage - 1
        if partner_stage >= self.pipeline_stages:
            return None
        partner = partner_stage * per + rank % per
        low, high = sorted((rank, partner))
        return (f"p2p-{low}-{high}", (low, high))

    def fault(self, kind: str, rank: int) -> TraceFault | None:
        return next((f for f in self.faults if f.kind == kind and rank in f.ranks), None)

    # ------------------------------------------------------------------- writing --
    def write(self, folder: Path, *, progress: Callable[[str], None] | None = None) -> list[Path]:
        """Write `rank-<r>.json.gz` for every rank; return the paths."""
        folder.mkdir(parents=True, exist_ok=True)
        ends = self._collective_ends()
        paths = []
        for rank in range(self.n_ranks):
            path = folder / f"rank-{rank}.json.gz"
            events = _RankSim(self, rank).events(ends)
            _write_trace(path, self._header(rank), events)
            paths.append(path)
            if progress is not None and (rank + 1) % 100 == 0:
                progress(f"wrote {rank + 1}/{self.n_ranks} traces")
        return paths

    def _header(self, rank: int) -> dict[str, Any]:
        return {
            "schemaVersion": 1,
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": self.n_ranks},
            "deviceProperties": [
                {"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85031714816,
                 "computeMajor": 9, "computeMinor": 0, "numSms": 132}
            ],
        }  # fmt: skip

    def _collective_ends(self) -> dict[tuple[int, int], float]:
        """(rank, collective index) → end time of that rank's collective kernel (µs).

        A collective completes when every member of its group has arrived: ranks are advanced
        collective by collective, each group instance resolved once all its members wait in it.
        """
        runs = [_RankSim(self, r).run(None) for r in range(self.n_ranks)]
        ends: dict[tuple[int, int], float] = {}
        index = [0] * self.n_ranks
        seen: dict[tuple[int, str], int] = {}
        waiting: dict[tuple[str, int], dict[int, Arrival]] = {}

        def advance(rank: int, end: float | None) -> None:
            try:
                arrival = next(runs[rank]) if end is None else runs[rank].send(end)
            except StopIteration:
                return
            nth = seen.get((rank, arrival.group), 0)
            seen[(rank, arrival.group)] = nth + 1
            waiting.setdefault((arrival.group, nth), {})[rank] = arrival

        for rank in range(self.n_ranks):
            advance(rank, None)
        while waiting:
            ready = [k for k, v in waiting.items() if len(v) == len(next(iter(v.values())).members)]
            if not ready:
                raise RuntimeError("synthetic job deadlocked: collectives out of order")
            for key in ready:
                members = waiting.pop(key)
                last = max(a.time for a in members.values())
                for rank, arrival in members.items():
                    end = last + arrival.transfer
                    ends[(rank, index[rank])] = end
                    index[rank] += 1
                    advance(rank, end)
        return ends


@dataclass(frozen=True)
class Arrival:
    group: str
    members: tuple[int, ...]
    time: float
    transfer: float
    """This rank's transfer time once all have arrived (µs)."""


class _RankSim:
    """One rank's timeline; `run` yields each collective arrival and receives its end."""

    def __init__(self, job: TraceJob, rank: int) -> None:
        self.job = job
        self.rank = rank
        self.sink: list[dict[str, Any]] | None = None
        self.correlation = rank * 10_000_000
        rng = np.random.default_rng([job.seed, rank])
        self.rng = rng
        self.speed = 1.0 + rng.uniform(-job.rank_jitter, job.rank_jitter)
        self.skew = rng.uniform(-job.clock_skew_us, job.clock_skew_us) if job.clock_skew_us else 0
        self.gpu = 0.0
        self.comm = 0.0
        self.cpu = 0.0

    def events(self, ends: dict[tuple[int, int], float]) -> list[dict[str, Any]]:
        self.sink = []
        run = self.run(None)
        index = 0
        arrival = next(run, None)
        while arrival is not None:
            try:
                arrival = run.send(ends[(self.rank, index)])
            except StopIteration:
                break
            index += 1
        return self.sink

    # ------------------------------------------------------------------ helpers --
    def _jitter(self) -> float:
        return float(1.0 + self.rng.uniform(-self.job.step_jitter, self.job.step_jitter))

    def _emit(self, event: dict[str, Any]) -> None:
        if self.sink is not None:
            event["ts"] = round(EPOCH_US + self.skew + event["ts"], 3)
            if "dur" in event:
                event["dur"] = round(event["dur"], 3)
            self.sink.append(event)

    def _cpu(self, cat: str, name: str, start: float, dur: float, **args: Any) -> None:
        event: dict[str, Any] = {
            "ph": "X", "cat": cat, "name": name, "pid": 1000 + self.rank, "tid": MAIN_TID,
            "ts": start, "dur": dur,
        }  # fmt: skip
        if args:
            event["args"] = args
        self._emit(event)

    def _launch(self, op: str, kernel: str, kernel_us: float, *, stream: int = COMPUTE_STREAM,
                cat: str = "kernel", not_before: float = 0.0,
                args: dict[str, Any] | None = None) -> tuple[float, float]:  # fmt: skip
        """A cpu_op launching one kernel; returns the kernel's (start, end)."""
        rank = self.rank
        launch_us = self._launch_us()
        op_us = (24.0 + launch_us) * self._jitter()
        start = self.cpu
        self.correlation += 1
        corr = self.correlation
        launch_at = start + 8.0
        api = "cudaMemcpyAsync" if cat == "gpu_memcpy" else "cudaLaunchKernel"
        if op:
            self._cpu("cpu_op", op, start, op_us, **{"External id": corr})
        self._cpu("cuda_runtime", api, launch_at, launch_us, correlation=corr)
        self._emit({"ph": "s", "id": corr, "pid": 1000 + rank, "tid": MAIN_TID, "ts": launch_at,
                    "cat": "ac2g", "name": "ac2g"})  # fmt: skip
        free = self.comm if stream == COMM_STREAM else self.gpu
        k_start = max(launch_at + launch_us + 4.0, free, not_before)
        k_end = k_start + kernel_us
        kargs = {"device": 0, "stream": stream, "correlation": corr, "External id": corr}
        if args:
            kargs.update(args)
        self._emit({"ph": "X", "cat": cat, "name": kernel, "pid": 0, "tid": stream,
                    "ts": k_start, "dur": kernel_us, "args": kargs})  # fmt: skip
        self._emit({"ph": "f", "id": corr, "pid": 0, "tid": stream, "ts": k_start,
                    "cat": "ac2g", "name": "ac2g", "bp": "e"})  # fmt: skip
        if stream == COMM_STREAM:
            self.comm = k_end
        else:
            self.gpu = k_end
        self.cpu = start + op_us + 4.0
        return k_start, k_end

    def _launch_us(self) -> float:
        gaps = self.job.fault("launch_gaps", self.rank)
        return 6.0 + (gaps.extra_ms * 1000.0 if gaps is not None else 0.0)

    def _kernel_us(self, kernel: str, base: float) -> float:
        us = base * self.speed * self._jitter()
        throttled = self.job.fault("throttled_gpu", self.rank)
        if throttled is not None:
            us *= throttled.factor
        straggler = self.job.fault("compute_straggler", self.rank)
        if straggler is not None and kernel in (ATTENTION, ATTENTION_BWD):
            us *= straggler.factor
        return us

    # ------------------------------------------------------------------ the step --
    def run(self, _unused: None) -> Generator[Arrival, float, None]:
        job, rank = self.job, self.rank
        layers = job.layers_of(rank)
        dp_name, dp_ranks = job.dp_group(rank)
        p2p = job.p2p_group(rank)
        n_buckets = -(-layers // job.layers_per_bucket)
        bucket_bytes = int(job.bucket_mb * 1e6)
        slow = job.fault("slow_link", rank)
        link_factor = slow.factor if slow is not None else 1.0
        for step in range(job.n_steps):
            step_start = self.cpu = max(self.cpu, self.gpu, self.comm)
            number = step + 1
            yield from self._step(
                step_start, number, layers, n_buckets, bucket_bytes, dp_name, dp_ranks, p2p,
                link_factor,
            )  # fmt: skip
            # loss.item(): the host waits for the device, which ends the step.
            sync_start = self.cpu
            end = max(sync_start + 10.0, self.gpu + 5.0, self.comm + 5.0)
            self._cpu("cuda_runtime", "cudaDeviceSynchronize", sync_start, end - sync_start)
            self.cpu = end + 15.0
            self._cpu("user_annotation", f"ProfilerStep#{number}", step_start,
                      self.cpu - step_start)  # fmt: skip

    def _step(
        self,
        step_start: float,
        number: int,
        layers: int,
        n_buckets: int,
        bucket_bytes: int,
        dp_name: str,
        dp_ranks: tuple[int, ...],
        p2p: tuple[str, tuple[int, ...]] | None,
        link_factor: float,
    ) -> Generator[Arrival, float, None]:
        job, rank = self.job, self.rank
        self.cpu = step_start + 20.0
        load = 120.0 * self._jitter()
        self._cpu("user_annotation", DATALOADER, self.cpu, load)
        self.cpu += load + 5.0
        hotspot = job.fault("python_hotspot", rank)
        python_us = (40.0 + (hotspot.extra_ms * 1000.0 if hotspot else 0.0)) * self._jitter()
        self._cpu("python_function", HOTSPOT, self.cpu, python_us)
        self.cpu += python_us + 5.0
        copy_us = 220.0 * self._jitter()
        memcpy = job.fault("memcpy_anomaly", rank)
        if memcpy is not None:
            copy_us *= memcpy.factor
        self._launch("aten::copy_", MEMCPY, copy_us, cat="gpu_memcpy")
        for _ in range(layers):
            for op, kernel, us in FORWARD:
                self._launch(op, kernel, self._kernel_us(kernel, us))
        ranks_text = "[" + ", ".join(str(r) for r in dp_ranks) + "]"
        n = len(dp_ranks)
        for bucket in range(n_buckets):
            for _ in range(min(job.layers_per_bucket, layers - bucket * job.layers_per_bucket)):
                for op, kernel, us in BACKWARD:
                    self._launch(op, kernel, self._kernel_us(kernel, us))
            # The bucket's gradients are ready when its last backward kernel ends.
            ready = self.gpu
            transfer = (
                2 * (n - 1) / max(n, 1) * bucket_bytes / (job.link_gbps * 1e3) * self._jitter()
            )
            args = {
                "Collective name": "allreduce", "In msg nelems": bucket_bytes // 2,
                "Out msg nelems": bucket_bytes // 2, "dtype": "BFloat16", "Group size": n,
                "Process Group Name": dp_name, "Process Group Ranks": ranks_text,
            }  # fmt: skip
            self._cpu("cpu_op", "record_param_comms", self.cpu, 12.0, **args)
            self.cpu += 14.0
            yield from self._collective(
                ALLREDUCE, args, ready, max(transfer, 1.0) * link_factor, dp_name, dp_ranks
            )
        if p2p is not None:
            pg_name, pair = p2p
            args = {
                "Collective name": "sendrecv", "In msg nelems": 4_000_000,
                "Out msg nelems": 4_000_000, "dtype": "BFloat16", "Group size": 2,
                "Process Group Name": pg_name,
                "Process Group Ranks": f"[{pair[0]}, {pair[1]}]",
            }  # fmt: skip
            self._cpu("cpu_op", "record_param_comms", self.cpu, 12.0, **args)
            self.cpu += 14.0
            transfer = 8e6 / (job.link_gbps * 1e3) * self._jitter() * link_factor
            yield from self._collective(SENDRECV, args, self.gpu, transfer, pg_name, pair)
        # The optimizer waits for every gradient bucket (stream wait on the comm stream).
        self.gpu = max(self.gpu, self.comm)
        for _ in range(2):
            self._launch("aten::_foreach_add_", OPTIMIZER, self._kernel_us(OPTIMIZER, 300.0))

    def _collective(
        self,
        kernel: str,
        args: dict[str, Any],
        ready: float,
        transfer: float,
        group: str,
        members: tuple[int, ...],
    ) -> Generator[Arrival, float, None]:
        """Launch an NCCL kernel; its end comes from the lock-step driver."""
        save_cpu = self.cpu
        arrival = max(self.cpu + 12.0 + self._launch_us(), self.comm, ready)
        end = yield Arrival(group=group, members=members, time=arrival, transfer=transfer)
        self.cpu = save_cpu
        self.comm = arrival  # the kernel starts at its arrival …
        self._launch("nccl:all_reduce" if "AllReduce" in kernel else "nccl:send_recv", kernel,
                     end - arrival, stream=COMM_STREAM, not_before=arrival, args=args)  # fmt: skip


def _write_trace(path: Path, header: dict[str, Any], events: list[dict[str, Any]]) -> None:
    """Kineto's layout: the header, then one event per line in traceEvents."""
    events.sort(key=lambda e: e["ts"])
    lines = ",\n".join(json.dumps(e, separators=(", ", ": ")) for e in events)
    head = json.dumps(header, indent=2)[:-2]
    text = f'{head},\n  "traceEvents": [\n{lines}\n  ],\n  "displayTimeUnit": "ms"\n}}\n'
    with gzip.open(path, "wt", compresslevel=1) as out:
        out.write(text)
