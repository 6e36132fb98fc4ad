"""A GPT-style transformer trained with DDP, with one GPU fault class injected on one rank: the
job `scripts/gpu-check.sh` runs through `perfdiag run` to capture GPU faults for the test suite.

    perfdiag run --nproc-per-node 2 -- benchmarks/gpu_transformer_train.py --scenario fp32

A plain torchrun script, nothing of perfdiag's hook or API in it (each rank's device and the
ranks' agreement to stop are those of the demo's job, perfdiag.local.demo.ddp), in pure torch
(no transformers version to depend on): a decoder of 6 blocks (d_model 512, 8 heads, causal
`scaled_dot_product_attention`, GELU MLP), vocab 4096, tied embeddings, batch 16 × 512 tokens,
bf16 autocast, AdamW. DDP over gloo with every rank on `cuda:<local rank % GPUs>`: on one GPU
both ranks share it (NCCL refuses two ranks on one device). 16 × 512 rather than 8 × 512:
inside a profiled window with Python stacks each kernel launch costs the host tens of
microseconds, and at 8 × 512 the kernels are shorter than that, so a fault that lengthens
kernels (longer sequences, a larger micro-batch) would vanish in the launch gaps instead of
lengthening the step.

Scenarios (the fault is on `--fault-rank`, default 1; each costs roughly 5–30% of a step), and
the verdict a right diagnosis gives, with both ranks on one GPU:

  healthy                   no fault                                  healthy, no finding
  fp32                      no autocast on the fault rank: its GEMMs   rank 1, gpu_compute,
                            and attention run in fp32                  an f32 / sgemm kernel
  tf32-off                  every rank trains in fp32 with TF32        rank 1, gpu_compute
                            matmuls, the fault rank with TF32 off
                            (`set_float32_matmul_precision`)
  seq2x                     the fault rank's sequences are twice as    rank 1, gpu_compute
                            long: the same kernels, longer calls
  microbatch                the fault rank's micro-batch is 3× the     rank 1, gpu_compute
                            others' (a per-rank batch size mismatch)
  activation-checkpointing  the fault rank checkpoints every block    rank 1, gpu_compute or
                            (torch.utils.checkpoint): backward         host-side op work
                            recomputes the forward                     (cpu_op, cuda_runtime,
                                                                       python); never host
  unfused-ops               the fault rank's LayerNorm and GELU are    rank 1, cpu_op,
                            written out as a dozen elementwise ops     cuda_runtime or the
                            each (one fused kernel on the others)      extra kernels
                                                                       (gpu_compute)
  sync-every-block          torch.cuda.synchronize() after every       rank 1, cuda_runtime
                            block on the fault rank, in the forward    (cudaDeviceSynchronize
                            and the backward pass: the host waits for  or its Python binding)
                            the GPU, and the GPU for the next launch
  logits-to-host            the fault rank copies its logits to        rank 1, gpu_memory,
                            fresh pageable host memory each step       Memcpy DtoH
                            (`.to("cpu")`, for metrics on the host)
  slow-h2d                  every rank adds per-token dense features;  rank 1, gpu_memory,
                            the others keep them on the GPU, the       Memcpy HtoD (Pageable
                            fault rank copies them from pageable host  -> Device)
                            memory each step (--upload-mib, 128)
  pinned-vs-pageable        every rank copies the features each step   rank 1, gpu_memory,
                            (--upload-mib, 256): the others from       Memcpy HtoD (Pageable
                            pinned memory, non_blocking; the fault     -> Device)
                            rank from pageable memory
  python-batch              the fault rank encodes its batch token by  rank 1, python,
                            token in Python (the others on the GPU),   encode_tokens_in_python
                            about --fault-ms (12) per step
  dataset-getitem           every rank reads a DataLoader (no          rank 1, dataloader,
                            workers); the fault rank's Dataset         decode_sample
                            decodes each sample in Python in
                            __getitem__, about --fault-ms per batch
  empty-cache               torch.cuda.empty_cache() after every step  rank 1, cuda_runtime,
                            on the fault rank: the allocator gives     cudaMalloc / cudaFree
                            its blocks back and cudaMallocs them again (or empty_cache)
  memory-hungry             the fault rank holds a large idle tensor   rank 1, cuda_runtime,
                            (--idle-gib, 4) and caps its allocator at  cudaMalloc / cudaFree
                            it plus --memory-headroom (1.25) × its
                            working set, with a garbage collection
                            threshold: blocks are freed and allocated
                            again (the log prints cudaMalloc/cudaFree
                            calls per step, for this and empty-cache)
  gpu-shared                a separate process on the fault rank's     one GPU: no rank named
                            GPU runs matrix products in a loop,        (the other process
                            about --hog-duty (0.3) of the time         slows both ranks
                                                                       alike); the fault rank
                                                                       on a GPU of its own:
                                                                       rank 1, gpu_compute or
                                                                       gpu_hardware

`expected_verdict()` holds these expectations as data (gpu-check.sh writes them next to each
capture; tests/support/perfdiag_testing/gpu_captures.py judges verdicts by them).

`--device cpu` runs every scenario at tiny sizes without a GPU (the test suite's check of each
scenario's code path): the CUDA-only calls (empty_cache, synchronize, the allocator's limits)
are skipped there, the copies stay host-to-host, and gpu-shared's other process spins a CPU
core for --hog-duty of the time. `--scenario a,b,…` runs several scenarios one after the other
in one process group (each with a fresh model), for such checks.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import select
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, Dataset

from perfdiag.local.demo.ddp import agree, rank_device

# -- scenarios and the verdict each should give --------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    name: str
    categories: tuple[str, ...]
    """Categories the fault rank's finding may carry; () when no rank is to be named."""
    functions: tuple[str, ...] = ()
    """Substrings of which the fault rank's finding's function must contain one; () for any."""


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("healthy", ()),
        Scenario("fp32", ("gpu_compute",), ("f32", "sgemm")),
        Scenario("tf32-off", ("gpu_compute",)),
        Scenario("seq2x", ("gpu_compute",)),
        Scenario("microbatch", ("gpu_compute",)),
        Scenario("activation-checkpointing", ("gpu_compute", "cpu_op", "cuda_runtime", "python")),
        Scenario("unfused-ops", ("cpu_op", "cuda_runtime", "gpu_compute")),
        Scenario("sync-every-block", ("cuda_runtime",), ("Synchronize", "synchronize")),
        Scenario("logits-to-host", ("gpu_memory",), ("Memcpy DtoH",)),
        Scenario("slow-h2d", ("gpu_memory",), ("Memcpy HtoD",)),
        Scenario("pinned-vs-pageable", ("gpu_memory",), ("Pageable",)),
        Scenario("python-batch", ("python",), ("encode_tokens_in_python",)),
        Scenario("dataset-getitem", ("dataloader",), ("decode_sample",)),
        Scenario(
            "empty-cache",
            ("cuda_runtime",),
            ("cudaMalloc", "cudaFree", "empty_cache", "emptyCache"),
        ),
        Scenario("memory-hungry", ("cuda_runtime",), ("cudaMalloc", "cudaFree")),
        Scenario("gpu-shared", ("gpu_compute", "gpu_hardware")),
    )
}


def expected_verdict(
    name: str, *, fault_rank: int = 1, world: int = 2, gpus: int = 1
) -> dict[str, Any]:
    """What a right verdict of one run says: `status`, the `culprits` (every one named, nobody
    else), the `categories` a culprit's finding may carry and `functions`, substrings of which
    its function must contain one (empty: any function)."""
    scenario = SCENARIOS[name]
    categories = scenario.categories
    # Another process on a GPU slows every rank on that GPU alike: a rank stands out only when
    # it has the GPU to itself.
    if name == "gpu-shared" and gpus < world:
        categories = ()
    culprit = bool(categories)
    return {
        "scenario": name,
        "status": "degraded" if culprit else "healthy",
        "culprits": [fault_rank] if culprit else [],
        "categories": sorted(categories),
        "functions": list(scenario.functions) if culprit else [],
        "gpus": gpus,
        "world": world,
    }


# -- sizes and arguments -------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    layers: int
    d_model: int
    heads: int
    vocab: int
    batch: int
    seq: int


CUDA_SIZES = Sizes(layers=6, d_model=512, heads=8, vocab=4096, batch=16, seq=512)
CPU_SIZES = Sizes(layers=2, d_model=64, heads=4, vocab=256, batch=2, seq=32)
# Per-device defaults of the fault knobs: (cuda, cpu).
FAULT_MS = (12.0, 1.0)
UPLOAD_MIB = {"slow-h2d": (128, 1), "pinned-vs-pageable": (256, 1)}
IDLE_GIB = (4.0, 0.01)
MICROBATCH_FACTOR = 3
AUX_SCALE = 1e-3  # the dense features' weight in the embedding: small, the model stays a LM
SYNC_EVERY = 5  # steps between the all-reduce of the loss and the stop flag (logging)
HOG_READY_S = 120.0
ALLOCATOR_SCENARIOS = ("empty-cache", "memory-hungry")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--scenario", default="healthy", help="a scenario, or several: a,b,…")
    parser.add_argument("--fault-rank", type=int, default=1)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps to train")
    parser.add_argument("--max-seconds", type=float, default=300.0, help="stop earlier then")
    parser.add_argument("--layers", type=int)
    parser.add_argument("--d-model", type=int)
    parser.add_argument("--heads", type=int)
    parser.add_argument("--vocab", type=int)
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--seq-len", type=int)
    parser.add_argument("--fault-ms", type=float, help="python-batch, dataset-getitem: ms")
    parser.add_argument("--upload-mib", type=int, help="slow-h2d, pinned-vs-pageable: MiB")
    parser.add_argument("--idle-gib", type=float, help="memory-hungry: the idle tensor, GiB")
    parser.add_argument("--memory-headroom", type=float, default=1.25, help="memory-hungry: cap")
    parser.add_argument("--hog-duty", type=float, default=0.3, help="gpu-shared: busy share")
    parser.add_argument(
        "--expectations",
        action="store_true",
        help="print every scenario's expected verdict as JSON (with --gpus) and exit",
    )
    parser.add_argument("--gpus", type=int, default=1, help="with --expectations")
    args = parser.parse_args(argv)
    scenarios = args.scenario.split(",")
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario {', '.join(unknown)}; one of {', '.join(SCENARIOS)}")
    args.scenarios = scenarios
    return args


def sizes_of(args: argparse.Namespace) -> Sizes:
    base = CUDA_SIZES if args.device == "cuda" else CPU_SIZES
    given = {
        "layers": args.layers,
        "d_model": args.d_model,
        "heads": args.heads,
        "vocab": args.vocab,
        "batch": args.batch_size,
        "seq": args.seq_len,
    }
    return replace(base, **{k: v for k, v in given.items() if v is not None})


# -- the model -----------------------------------------------------------------------------------


def layer_norm_unfused(x: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
    """LayerNorm as separate elementwise and reduction ops: one kernel each, forward and
    backward, where F.layer_norm is one fused kernel."""
    mean = x.mean(dim=-1, keepdim=True)
    centered = x - mean
    variance = (centered * centered).mean(dim=-1, keepdim=True)
    return centered * torch.rsqrt(variance + norm.eps) * norm.weight + norm.bias


def gelu_unfused(x: torch.Tensor) -> torch.Tensor:
    """GELU's tanh approximation written out op by op (F.gelu(approximate="tanh") fused)."""
    inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)
    return 0.5 * x * (1.0 + torch.tanh(inner))


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.out = nn.Linear(4 * d_model, d_model)
        self.unfused = False

    def norm(self, layer: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
        return layer_norm_unfused(x, layer) if self.unfused else layer(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        qkv = self.qkv(self.norm(self.ln1, x)).view(b, t, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(b, t, d))
        hidden = self.fc(self.norm(self.ln2, x))
        hidden = gelu_unfused(hidden) if self.unfused else F.gelu(hidden, approximate="tanh")
        result: torch.Tensor = x + self.out(hidden)
        return result


class Decoder(nn.Module):
    def __init__(self, sizes: Sizes, max_seq: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(sizes.vocab, sizes.d_model)
        self.position = nn.Embedding(max_seq, sizes.d_model)
        self.blocks = nn.ModuleList(Block(sizes.d_model, sizes.heads) for _ in range(sizes.layers))
        self.ln_f = nn.LayerNorm(sizes.d_model)
        self.head = nn.Linear(sizes.d_model, sizes.vocab, bias=False)
        self.head.weight = self.embed.weight
        self.checkpointing = False

    def forward(self, tokens: torch.Tensor, aux: torch.Tensor | None = None) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embed(tokens) + self.position(positions)
        if aux is not None:
            x = x + AUX_SCALE * aux.mean(dim=-1, keepdim=True)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.checkpointing else block(x)
        logits: torch.Tensor = self.head(self.ln_f(x))
        return logits


# -- inputs --------------------------------------------------------------------------------------

LCG_A, LCG_C, LCG_MASK = 1103515245, 12345, 0x7FFFFFFF


def encode_tokens_in_python(raw: list[int], rounds: int, vocab: int) -> list[int]:
    """Token ids from raw ids, one token at a time in Python (a hand-written tokenizer's
    inner loop). No calls inside the loop: the profiler records calls, not loop iterations,
    so the loop costs the same inside the window as outside."""
    out = [0] * len(raw)
    for i, value in enumerate(raw):
        h = value
        r = rounds
        while r:
            h = (h * LCG_A + LCG_C) & LCG_MASK
            r -= 1
        out[i] = h % vocab
    return out


def encode_tokens_on_device(raw: torch.Tensor, rounds: int, vocab: int) -> torch.Tensor:
    """The same encoding as whole-tensor ops (a few kernels, whatever the batch)."""
    h = raw.clone()
    # The recurrence reduced mod 2^31 stays exact in int64; a fixed 4 rounds: the healthy
    # ranks' cost must not grow with the fault rank's calibration.
    for _ in range(min(rounds, 4)):
        h = (h * LCG_A + LCG_C) & LCG_MASK
    return h % vocab


def decode_sample(raw: list[int], rounds: int, vocab: int) -> list[int]:
    """A Dataset's per-sample decoding in Python (the same inner loop as the tokenizer)."""
    return encode_tokens_in_python(raw, rounds, vocab)


class TokenDataset(Dataset[torch.Tensor]):
    """Samples of seq + 1 token ids; with `rounds`, each is decoded in Python when read."""

    def __init__(self, raw: torch.Tensor, rounds: int, vocab: int) -> None:
        self.encoded = raw % vocab
        self.raw = [row.tolist() for row in raw]
        self.rounds = rounds
        self.vocab = vocab

    def __len__(self) -> int:
        return len(self.raw)

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.rounds:
            return torch.tensor(decode_sample(self.raw[index], self.rounds, self.vocab))
        return self.encoded[index]


def endless(loader: DataLoader[torch.Tensor]) -> Iterator[torch.Tensor]:
    while True:
        yield from loader


def calibrated_rounds(target_ms: float, tokens: int, vocab: int) -> int:
    """Rounds of the Python encoding loop that make `tokens` tokens cost about `target_ms`:
    the loop's fixed cost per token and its cost per round, each the best of three."""
    raw = list(range(tokens))

    def best_of_three(rounds: int) -> float:
        best = math.inf
        for _ in range(3):
            started = time.perf_counter()
            encode_tokens_in_python(raw, rounds, vocab)
            best = min(best, time.perf_counter() - started)
        return best

    fixed, probe = best_of_three(0), 8
    per_round = max(1e-9, (best_of_three(probe) - fixed) / probe)
    return max(1, round((target_ms / 1000 - fixed) / per_round))


# -- the other process on the GPU (gpu-shared) -------------------------------------------------

HOG_CODE = """
import ctypes, os, sys, time
device, duty, parent = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
if sys.platform.startswith("linux"):
    # SIGTERM when the rank that started it dies: a killed run leaves nothing on the GPU.
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, 15)  # PR_SET_PDEATHSIG
if device.startswith("cuda"):
    import torch
    torch.cuda.set_device(device)
    a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    def burst():
        for _ in range(8):
            a @ b
        torch.cuda.synchronize()
else:
    def burst():
        total = 0
        for i in range(20000):
            total += i * i
announced = False
while os.getppid() == parent:
    started = time.perf_counter()
    burst()
    busy = time.perf_counter() - started
    if not announced:
        print("ready", flush=True)
        announced = True
    time.sleep(busy * (1.0 - duty) / duty)
"""


def start_hog(device: torch.device, duty: float) -> subprocess.Popen[str]:
    """Start the other process and wait until it runs its first burst."""
    target = f"cuda:{device.index}" if device.type == "cuda" else "cpu"
    hog = subprocess.Popen(
        [sys.executable, "-c", HOG_CODE, target, str(duty), str(os.getpid())],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert hog.stdout is not None
    ready, _, _ = select.select([hog.stdout], [], [], HOG_READY_S)
    line = hog.stdout.readline() if ready else ""
    if line.strip() != "ready":
        hog.kill()
        raise RuntimeError(f"the other process on {target} did not start (exit {hog.wait()})")
    return hog


def stop_hog(hog: subprocess.Popen[str]) -> None:
    hog.terminate()
    try:
        hog.wait(10)
    except subprocess.TimeoutExpired:
        hog.kill()
        hog.wait()


class AllocatorCalls:
    """The caching allocator's cudaMalloc/cudaFree calls per step from step 3 on (the steps a
    window holds): the log says whether empty-cache and memory-hungry made it allocate."""

    KEYS = ("num_device_alloc", "num_device_free", "num_alloc_retries")

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.first: tuple[int, dict[str, int]] | None = None
        self.last: tuple[int, dict[str, int]] | None = None

    def counts(self) -> dict[str, int]:
        if self.device.type != "cuda":
            return dict.fromkeys(self.KEYS, 0)
        stats = torch.cuda.memory_stats(self.device)
        return {key: int(stats.get(key, 0)) for key in self.KEYS}

    def step(self, step: int) -> None:
        if step >= 3:
            self.last = (step, self.counts())
            self.first = self.first or self.last

    def summary(self) -> str:
        if self.first is None or self.last is None or self.last[0] == self.first[0]:
            return "allocator calls: too few steps"
        steps = self.last[0] - self.first[0]
        per_step = {k: (self.last[1][k] - self.first[1][k]) / steps for k in self.KEYS}
        return (
            f"per step: cudaMalloc {per_step['num_device_alloc']:.0f}, cudaFree "
            f"{per_step['num_device_free']:.0f}, allocation retries "
            f"{per_step['num_alloc_retries']:.1f}"
        )


# -- one scenario --------------------------------------------------------------------------------


@dataclass
class Setup:
    model: Decoder
    ddp: DistributedDataParallel
    optimizer: torch.optim.Optimizer
    batches: Callable[[int], tuple[torch.Tensor, torch.Tensor | None]]
    autocast: bool
    after_step: Callable[[int], None]
    cleanup: Callable[[], None]
    notes: list[str]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def add_sync_hooks(model: Decoder, device: torch.device) -> None:
    """Synchronize after every block, in the forward and the backward pass."""

    def after_backward(grad: torch.Tensor) -> None:
        synchronize(device)

    def after_forward(module: nn.Module, inputs: Any, output: Any) -> None:
        synchronize(device)
        if isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(after_backward)  # type: ignore[no-untyped-call]

    for block in model.blocks:
        block.register_forward_hook(after_forward)


def memory_cap(device: torch.device, idle_gib: float, headroom: float, notes: list[str]) -> Any:
    """Hold an idle tensor and cap the allocator at it plus `headroom` × the working set seen
    so far, so that blocks are freed and allocated again (what a job running near the memory
    limit does). Returns the idle tensor (kept alive by the caller)."""
    if device.type != "cuda":
        return torch.empty(int(idle_gib * 2**30), dtype=torch.uint8)
    working = torch.cuda.max_memory_allocated(device)
    free, total = torch.cuda.mem_get_info(device)
    # Real memory is shared with the other ranks on this GPU: a quarter of what is free.
    idle_bytes = int(min(idle_gib * 2**30, free / 4))
    idle = torch.empty(idle_bytes, dtype=torch.uint8, device=device)
    cap = idle_bytes + headroom * working
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), device)
    # Above 60% of the cap the allocator frees cached blocks before it allocates new ones.
    # A private API whose name moves between torch versions: without it, the cap alone.
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.cuda.memory._set_allocator_settings("garbage_collection_threshold:0.6")
    except Exception as exc:
        notes.append(f"no garbage collection threshold ({exc})")
    torch.cuda.empty_cache()
    notes.append(
        f"idle {idle_bytes / 2**30:.1f} GiB, working set {working / 2**30:.2f} GiB, "
        f"allocator cap {cap / 2**30:.2f} GiB of {total / 2**30:.0f}"
    )
    return idle


def set_up(
    name: str,
    args: argparse.Namespace,
    sizes: Sizes,
    rank: int,
    device: torch.device,
) -> Setup:
    faulty = name != "healthy" and rank == args.fault_rank
    cuda = device.type == "cuda"
    pick = 0 if cuda else 1
    notes: list[str] = []
    # Every scenario sets the global flags it reads, so that scenarios run one after the other
    # in one process do not inherit each other's.
    torch.set_float32_matmul_precision("high" if name == "tf32-off" and not faulty else "highest")
    torch.manual_seed(0)

    batch, seq = sizes.batch, sizes.seq
    if faulty and name == "microbatch":
        batch *= MICROBATCH_FACTOR
    if faulty and name == "seq2x":
        seq *= 2
    model = Decoder(sizes, max_seq=2 * sizes.seq).to(device)
    for block in model.blocks:
        assert isinstance(block, Block)
        block.unfused = faulty and name == "unfused-ops"
    model.checkpointing = faulty and name == "activation-checkpointing"
    if faulty and name == "sync-every-block":
        add_sync_hooks(model, device)

    cleanup: list[Callable[[], None]] = []
    if faulty and name == "gpu-shared":
        hog = start_hog(device, args.hog_duty)
        cleanup.append(lambda: stop_hog(hog))
        notes.append(f"other process {hog.pid} busy {args.hog_duty:.0%} of the time")

    ddp = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    generator = torch.Generator().manual_seed(1000 + rank)
    raw = torch.randint(0, 2**30, (4 * batch, seq + 1), generator=generator)

    def take(step: int) -> torch.Tensor:
        rows = (step % 4) * batch
        return raw[rows : rows + batch]

    aux_host: torch.Tensor | None = None
    aux_device: torch.Tensor | None = None
    if name in UPLOAD_MIB:
        mib = args.upload_mib or UPLOAD_MIB[name][pick]
        width = max(1, mib * 2**20 // (4 * batch * seq))
        features = torch.randn(batch, seq, width, generator=generator)
        if name == "slow-h2d" and not faulty:
            aux_device = features.to(device)  # the dataset lives on the GPU
        elif name == "pinned-vs-pageable" and not faulty and cuda:
            aux_host = features.pin_memory()
        else:
            aux_host = features
        notes.append(f"features {features.numel() * 4 / 2**20:.0f} MiB per step")

    def aux_for_step() -> torch.Tensor | None:
        if aux_device is not None:
            return aux_device
        if aux_host is None:
            return None
        # Pageable memory: the copy is staged through a driver buffer and holds the host.
        return aux_host.to(device, non_blocking=aux_host.is_pinned())

    batches: Callable[[int], tuple[torch.Tensor, torch.Tensor | None]]
    fault_ms = args.fault_ms or FAULT_MS[pick]
    if name == "python-batch":
        rounds = calibrated_rounds(fault_ms, batch * (seq + 1), sizes.vocab) if faulty else 4
        raw_device = raw.to(device)
        if faulty:
            notes.append(f"{rounds} rounds per token, ~{fault_ms:g} ms per batch")

        def python_batches(step: int) -> tuple[torch.Tensor, torch.Tensor | None]:
            if faulty:
                ids = encode_tokens_in_python(take(step).flatten().tolist(), rounds, sizes.vocab)
                return torch.tensor(ids).view(batch, seq + 1).to(device), aux_for_step()
            rows = (step % 4) * batch
            chunk = raw_device[rows : rows + batch]
            return encode_tokens_on_device(chunk, rounds, sizes.vocab), aux_for_step()

        batches = python_batches
    elif name == "dataset-getitem":
        rounds = calibrated_rounds(fault_ms, batch * (seq + 1), sizes.vocab) if faulty else 0
        if faulty:
            notes.append(f"{rounds} rounds per token, ~{fault_ms:g} ms per batch")
        loader = DataLoader(TokenDataset(raw, rounds, sizes.vocab), batch_size=batch)
        stream = endless(loader)

        def loader_batches(step: int) -> tuple[torch.Tensor, torch.Tensor | None]:
            return next(stream).to(device), aux_for_step()

        batches = loader_batches
    else:
        resident = (raw % sizes.vocab).to(device)

        def resident_batches(step: int) -> tuple[torch.Tensor, torch.Tensor | None]:
            rows = (step % 4) * batch
            return resident[rows : rows + batch], aux_for_step()

        batches = resident_batches

    idle: list[Any] = []
    allocator = AllocatorCalls(device) if faulty and name in ALLOCATOR_SCENARIOS else None

    def after_step(step: int) -> None:
        if faulty and name == "empty-cache" and cuda:
            torch.cuda.empty_cache()
        if faulty and name == "memory-hungry" and step == 2:
            # The working set is known after two steps: activations, gradients, AdamW's state
            # (first step) and DDP's rebuilt buckets (second).
            idle_gib = args.idle_gib if args.idle_gib is not None else IDLE_GIB[pick]
            idle.append(memory_cap(device, idle_gib, args.memory_headroom, notes))
        if allocator is not None:
            allocator.step(step)

    def run_cleanup() -> None:
        for action in cleanup:
            action()
        if allocator is not None:
            notes.append(allocator.summary())
        idle.clear()
        if cuda and faulty and name == "memory-hungry":
            torch.cuda.set_per_process_memory_fraction(1.0, device)

    return Setup(
        model=model,
        ddp=ddp,
        optimizer=optimizer,
        batches=batches,
        autocast=name != "tf32-off" and not (faulty and name == "fp32"),
        after_step=after_step,
        cleanup=run_cleanup,
        notes=notes,
    )


def train(
    name: str, args: argparse.Namespace, sizes: Sizes, rank: int, device: torch.device
) -> None:
    world = dist.get_world_size()
    setup = set_up(name, args, sizes, rank, device)
    if rank == 0:
        fault = f" (fault on rank {args.fault_rank})" if name != "healthy" else ""
        print(f"gpu_transformer_train: {name}{fault}, {world} ranks on {device}, {sizes}")
    step, started, step_times = 0, time.monotonic(), []
    try:
        while step < args.steps:
            step_started = time.perf_counter()
            tokens, aux = setup.batches(step)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=setup.autocast):
                logits = setup.ddp(tokens[:, :-1], aux)
                loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
            if name == "logits-to-host" and rank == args.fault_rank:
                # Metrics on the host: a copy of the logits into fresh pageable memory.
                host_logits = logits.detach().to("cpu", copy=True)
                del host_logits
            loss.backward()  # type: ignore[no-untyped-call]
            setup.optimizer.step()
            setup.optimizer.zero_grad(set_to_none=True)
            step += 1
            setup.after_step(step)
            if step % SYNC_EVERY == 0 or step == args.steps:
                # Logging, as training loops do: the loss, and whether any rank ran out of time.
                _, late = agree(loss, time.monotonic() - started > args.max_seconds)
                if late:
                    break
            step_times.append(time.perf_counter() - step_started)
    finally:
        setup.cleanup()
    if step_times[2:] and rank in (0, args.fault_rank):
        # Step times are the same on every rank (each step ends in an all-reduce); printed
        # for the log, next to the verdict.
        median_ms = statistics.median(step_times[2:]) * 1000
        notes = "".join(f"; {note}" for note in setup.notes) if rank == args.fault_rank else ""
        print(
            f"gpu_transformer_train: {name} rank {rank}: {step} steps, median {median_ms:.1f} ms"
            + notes
        )
    dist.barrier()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.expectations:
        print(json.dumps([expected_verdict(s, fault_rank=args.fault_rank, gpus=args.gpus)
                          for s in SCENARIOS], indent=1))  # fmt: skip
        return
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    device = rank_device(args.device)
    sizes = sizes_of(args)
    try:
        for name in args.scenarios:
            train(name, args, sizes, rank, device)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
