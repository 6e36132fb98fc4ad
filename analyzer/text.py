"""Wording shared by findings, the summary sentence and the report."""

from __future__ import annotations

import re
from collections.abc import Iterable

from perfdiag.api.ranks import format_runs, rank_runs, runs_phrase
from perfdiag.api.schema import IDLE, IDLE_FUNCTION, OTHER_FUNCTION

NEXT_STEP: dict[str, str] = {
    "python": "look at what this Python code does differently on that rank (per-rank data or "
    "input sizes, logging, extra work)",
    "cpu_op": "this rank runs more or slower aten ops: check for uneven batch or sequence sizes, "
    "rank-specific computation, and CPU contention on its host",
    "dataloader": "its input pipeline is slow: check DataLoader num_workers, storage or network "
    "reads, and the shard this rank reads",
    "gc": "Python garbage-collection pauses: reduce allocation churn, or gc.freeze() after "
    "setup / raise the gc thresholds",
    "gpu_compute": "its GPU kernels take longer: check per-rank input sizes, GPU clocks and "
    "thermals (nvidia-smi -q -d CLOCK,PERFORMANCE)",
    "gpu_memory": "its memory copies take longer: check host↔device transfers (pinned memory) "
    "and PCIe/NVLink health",
    "cuda_runtime": "host-side CUDA API time: look for synchronizations (.item(), .cpu(), "
    "torch.cuda.synchronize) and kernel-launch overhead",
    "communication": "its collectives are slower: check this rank's network link or NIC and "
    "the process-group topology",
    "gpu_hardware": "the GPU is degraded: check clocks, thermals, power and ECC errors "
    "(nvidia-smi -q); drain the node if it persists",
    "network": "the link is degraded: check NIC/InfiniBand port counters, cabling and switch "
    "errors for this host",
    "host": "the host is contended or degraded: check CPU frequency, other processes and "
    "memory pressure on it",
}

# Host-side CUDA calls a finding can name, and what to do about each kind: the allocator
# returning memory to the driver and taking it back, and the host waiting for the GPU. The
# Python bindings that make them (torch.cuda.empty_cache, torch.cuda.synchronize) count too.
CUDA_ALLOCATOR_CALL = re.compile(
    r"^(cudaMalloc|cudaFree|cuMemAlloc|cuMemFree|cudaHostAlloc|cudaFreeHost|cuMemCreate"
    r"|cuMemRelease|cuMemMap|cuMemUnmap)|_cuda_emptyCache|torch/cuda/memory\.py\(\d+\): empty_cache"
)
CUDA_SYNC_CALL = re.compile(
    r"^(cudaDeviceSynchronize|cudaStreamSynchronize|cudaEventSynchronize|cuStreamSynchronize"
    r"|cuEventSynchronize|cuCtxSynchronize)|_cuda_synchronize|aten::_local_scalar_dense"
    r"|aten::item$|torch/cuda/__init__\.py\(\d+\): synchronize"
)
CUDA_CALL_NEXT_STEP = {
    "allocator": "the CUDA caching allocator gives memory back and takes it again in every step "
    "(torch.cuda.empty_cache() in the loop, or fragmentation near the memory limit): remove "
    "empty_cache from the step, or set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
    "sync": "the host waits for the GPU inside the step (.item(), .cpu(), torch.cuda."
    "synchronize(), a blocking copy): move the read out of the step or make it asynchronous "
    "(non_blocking copies, a CUDA event read later)",
}


def cuda_call_kind(function: str | None) -> str | None:
    """'allocator' or 'sync' for a host-side CUDA call of that kind (or its Python binding)."""
    if function is None:
        return None
    if CUDA_ALLOCATOR_CALL.search(function):
        return "allocator"
    if CUDA_SYNC_CALL.search(function):
        return "sync"
    return None


def next_step(category: str, function: str | None) -> str:
    """What to check next for a finding of `category` naming `function`."""
    kind = cuda_call_kind(function)
    if kind is not None:
        return CUDA_CALL_NEXT_STEP[kind]
    return NEXT_STEP.get(category, "")


RANGE_NEXT_STEP: dict[str, str] = {
    "python": "the job is bound by Python overhead: batch small ops, move per-sample Python "
    "work into the DataLoader, or use torch.compile / CUDA graphs",
    "gc": "garbage collection pauses every rank: reduce allocation churn or gc.freeze() after "
    "setup",
    "dataloader": "every rank waits for input: raise DataLoader num_workers, enable "
    "pin_memory/prefetching, or speed up the storage it reads",
    "cuda_runtime": "host-side CUDA calls are on the critical path: remove synchronizations "
    "and batch kernel launches (CUDA graphs)",
    "communication": "the job is communication-bound: overlap communication with compute "
    "(bucket sizes), use gradient compression or a faster interconnect, or fewer ranks",
}


def format_ranks(ranks: Iterable[int]) -> str:
    """[0, 1, 2, 3, 7] → '0-3,7' (long lists are cut, with the count)."""
    return format_runs(rank_runs(ranks))


def ranks_phrase(ranks: Iterable[int], capital: bool = False) -> str:
    return runs_phrase(rank_runs(ranks), capital=capital)


def waits(ranks: Iterable[int]) -> str:
    """The verb after ranks_phrase: "rank 0 waits", "ranks 0,2 wait"."""
    return "waits" if len(set(ranks)) == 1 else "wait"


def ms(value: float) -> str:
    """Milliseconds with sensible precision. Rounded to the µs first, as verdict.json's evidence
    holds its numbers: a value and its evidence print alike, whichever is formatted."""
    value = round(value, 3)
    if abs(value) >= 100:
        return f"{value:.0f} ms"
    if abs(value) >= 10:
        return f"{value:.1f} ms"
    return f"{value:.2f} ms"


def pct(fraction: float) -> str:
    """0.381 → '38%', 0.052 → '5.2%', 0.05 → '5%'."""
    if abs(fraction) < 0.1:
        text = f"{fraction * 100:.1f}"
        return (text[:-2] if text.endswith(".0") else text) + "%"
    return f"{fraction * 100:.0f}%"


MAX_NAME = 100
"""Longest function name written into a sentence; verdict.json's evidence keeps the whole name."""


def short(function: str | None) -> str:
    """A function's name as a sentence shows it: a C++ kernel's template arguments and
    parameters (often thousands of characters) folded to `<…>` and `(…)`, then cut to MAX_NAME."""
    if function is None:
        return ""
    if len(function) <= MAX_NAME:
        return function
    out: list[str] = []
    depth = 0
    for char in function:
        if char in "<(":
            if depth == 0:
                out.append(char + "…")
            depth += 1
        elif char in ">)" and depth:
            depth -= 1
            if depth == 0:
                out.append(char)
        elif depth == 0:
            out.append(char)
    folded = "".join(out)
    return folded if len(folded) <= MAX_NAME else folded[: MAX_NAME - 1] + "…"


def what(function: str | None, category: str) -> str:
    """How to name a contributor: a function with its category, or the category's time."""
    if category == IDLE or function == IDLE_FUNCTION:
        return "time outside any profiled operation"
    if function is None:
        return f"{category} time"
    if function == OTHER_FUNCTION:
        return f"other (small) {category} functions"
    return f"{short(function)} ({category})"


_KIND_OF_FUNCTION = {
    "python": "Python function",
    "cpu_op": "op",
    "dataloader": "data loading in",
    "gc": "garbage collection",
    "communication": "collective",
    "gpu_compute": "kernel",
    "gpu_memory": "copy",
    "cuda_runtime": "CUDA call",
}


def what_inline(function: str | None, category: str) -> str:
    """A contributor named inside a sentence: 'Python function train.py(57): tokenize'."""
    if category == IDLE or function is None or function in (IDLE_FUNCTION, OTHER_FUNCTION):
        return what(function, category)
    return f"{_KIND_OF_FUNCTION.get(category, category)} {short(function)}"
