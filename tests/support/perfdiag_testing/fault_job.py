"""A torchrun training script with one injected fault class: the job the fault suite diagnoses.

Data-parallel (DDP, gloo, CPU) training of a small MLP on synthetic data through a real torch
DataLoader: the demo's model, data and optimizer step (perfdiag.local.demo.ddp); nothing of
perfdiag's hook or API. The faults are this script's own functions, called from its loop, so that
the diagnosis names them as a user's code (a frame under perfdiag/ is library code to it).
`benchmarks/fault_suite.py` runs it through `perfdiag run` exactly as a user would, with
`--fault CLASS --fault-ranks R[,R…]`:

  healthy          no fault
  noisy-steps      no fault, but every step does a different amount of work (the same on
                   every rank): step times vary by 2× within the window
  python-hotspot   the fault ranks run a pure-Python tokenizer on each batch
  compute          the fault ranks run extra matrix products (aten work)
  mixed            the first fault rank: Python tokenizer; the second: extra matrix products
  graded           the fault ranks do --scale × the step's matrix work, one factor per rank
  larger-batch     the fault ranks train on a 3× larger batch (same code path)
  intermittent     the fault ranks run a 3× tokenizer on every third step only
  gil-thread       the fault ranks run a busy background Python thread (a metrics exporter)
  sleep            the fault ranks block in time.sleep inside flush_metrics() each step
  dataset          the fault ranks' Dataset.__getitem__ does extra Python work
  loader-worker    every rank reads through a DataLoader worker process; the fault ranks'
                   worker is slow, so their training thread waits for batches
  cpu-quota        the fault ranks' processes are held to a CPU quota (a cgroup, what a
                   Kubernetes CPU limit does); needs root and a writable cpu cgroup
  checkpoint       the fault ranks save a checkpoint every 4 steps
  logging          the fault ranks format and write a large metrics record every 3 steps
  threads          the fault ranks run torch with 4 intra-op threads (the others 1) and a
                   background preprocessing thread of native torch work (the GIL released)
  memory           the fault ranks allocate and touch a fresh 64 MB buffer each step
  uneven           every rank's batch holds a different amount of work each step (uneven
                   sequence lengths): no single outlier, a spread
  slow-node        the fault ranks (the ranks of one node) all do extra matrix work

The job trains until --stop-file exists (or --max-seconds pass); ranks agree on stopping
through an all-reduce every few steps, as training loops do for logging.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from perfdiag.local.demo.ddp import (
    Labelled,
    SyntheticDataset,
    Trainer,
    agree,
    build_model,
    epochs,
    finish,
)

FAULTS = (
    "healthy",
    "noisy-steps",
    "python-hotspot",
    "compute",
    "mixed",
    "graded",
    "larger-batch",
    "intermittent",
    "gil-thread",
    "sleep",
    "dataset",
    "loader-worker",
    "cpu-quota",
    "checkpoint",
    "logging",
    "threads",
    "memory",
    "uneven",
    "slow-node",
)
SYNC_EVERY = 5
BASE_MATRIX = 192


class DecodingDataset(SyntheticDataset):
    """Samples whose reading also decodes `slow_words` words in Python (0: none)."""

    def __init__(self, size: int, slow_words: int = 0, read_delay_s: float = 0.0) -> None:
        super().__init__(size, read_delay_s)
        self.slow_words = slow_words

    def __getitem__(self, index: int) -> Labelled:
        if self.slow_words:
            decode_record(self.slow_words)
        return super().__getitem__(index)


def decode_record(words: int) -> int:
    """Pure-Python per-sample decoding (the kind of work a custom Dataset does)."""
    total = 0
    for position in range(words):
        total += len(f"field{position % 97}") * (position & 7)
    return total


def tokenize(batch_size: int, words_per_sample: int) -> int:
    """A pure-Python text pipeline on the training thread (no calls in its inner loop)."""
    vocabulary: dict[str, int] = {}
    total = 0
    for sample in range(batch_size):
        for position in range(words_per_sample):
            word = f"w{(sample * 31 + position * 17) % 997}"
            if word not in vocabulary:
                vocabulary[word] = total % 9973
            total += vocabulary[word] % 7
    return total


def augment(size: int, repeats: int) -> torch.Tensor:
    """The step's own matrix work (a feature transform every rank runs)."""
    a = torch.ones(size, size) * 0.01
    b = torch.ones(size, size) * 0.02
    for _ in range(repeats):
        a = torch.tanh(a @ b)
    return a


def extra_compute(size: int, repeats: int) -> torch.Tensor:
    """Matrix work only the fault ranks do."""
    return augment(size, repeats)


def flush_metrics(seconds: float) -> None:
    """Push metrics to a collector that answers slowly (the call blocks)."""
    time.sleep(seconds)


def write_metrics_record(path: Path, step: int) -> None:
    """A large structured log record, formatted and written synchronously."""
    record = {f"layer{i}.grad_norm": [step * 0.001 * j for j in range(64)] for i in range(400)}
    with path.open("a") as out:
        out.write(repr(record))
        out.write("\n")
        out.flush()
        os.fsync(out.fileno())


def save_checkpoint(model: nn.Module, path: Path) -> None:
    state = {k: v.repeat(32, 1) if v.dim() == 2 else v for k, v in model.state_dict().items()}
    torch.save(state, path)
    with path.open("rb") as handle:
        os.fsync(handle.fileno())


def cache_features(megabytes: int) -> int:
    """Allocate and touch a fresh buffer (page faults on every page)."""
    buffer = bytearray(megabytes << 20)
    for offset in range(0, len(buffer), 4096):
        buffer[offset] = 1
    return len(buffer)


def metrics_exporter(stop: threading.Event) -> None:
    """A background thread that serializes metrics in pure Python, holding the GIL."""
    counter = 0
    while not stop.is_set():
        for i in range(20000):  # no calls inside: the profiler records no event per iteration
            counter = (counter * 31 + i) % 1000003


def preprocess_ahead(stop: threading.Event) -> None:
    """A background thread preparing inputs with native torch work (the GIL is released)."""
    a = torch.ones(BASE_MATRIX, BASE_MATRIX)
    while not stop.is_set():
        a = torch.tanh(a @ a) * 0.5


def hold_to_cpu_quota(fraction: float) -> str:
    """Move this process into a cpu cgroup limited to `fraction` of one core."""
    pid = os.getpid()
    v2 = Path("/sys/fs/cgroup/cgroup.controllers")
    if v2.exists():
        group = Path(f"/sys/fs/cgroup/perfdiag-fault-{pid}")
        group.mkdir(exist_ok=True)
        (group / "cpu.max").write_text(f"{int(fraction * 100000)} 100000")
        (group / "cgroup.procs").write_text(str(pid))
        return str(group)
    group = Path(f"/sys/fs/cgroup/cpu/perfdiag-fault-{pid}")
    group.mkdir(exist_ok=True)
    (group / "cpu.cfs_period_us").write_text("100000")
    (group / "cpu.cfs_quota_us").write_text(str(int(fraction * 100000)))
    (group / "cgroup.procs").write_text(str(pid))
    return str(group)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fault", choices=FAULTS, default="healthy")
    parser.add_argument("--fault-ranks", default="", help="comma-separated ranks")
    parser.add_argument(
        "--scale", default="", help="graded: matrix-work factor per fault rank, e.g. 1.5,3"
    )
    parser.add_argument(
        "--base-repeats", type=int, default=6, help="matrix products every rank does per step"
    )
    parser.add_argument(
        "--extra-repeats",
        type=int,
        default=8,
        help="compute, mixed, slow-node: matrix products only the fault ranks add per step",
    )
    parser.add_argument("--stop-file", default=None)
    parser.add_argument("--max-seconds", type=float, default=300.0)
    parser.add_argument("--batch-size", type=int, default=128)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    fault_ranks = [int(r) for r in args.fault_ranks.split(",") if r.strip()]
    rank_env = int(os.environ.get("RANK", "0"))
    faulty = args.fault != "healthy" and rank_env in fault_ranks
    if faulty and args.fault == "cpu-quota":
        hold_to_cpu_quota(0.15)  # before torch starts its threads
    torch.set_num_threads(4 if faulty and args.fault == "threads" else 1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    index = fault_ranks.index(rank) if faulty else -1
    scales = [float(s) for s in args.scale.split(",") if s.strip()]
    work_scale = scales[index] if faulty and args.fault == "graded" and scales else 1.0

    batch = args.batch_size * (3 if faulty and args.fault == "larger-batch" else 1)
    dataset = DecodingDataset(
        batch * world * 8,
        slow_words=300 if faulty and args.fault == "dataset" else 0,
        read_delay_s=0.0004 if faulty and args.fault == "loader-worker" else 0.0,
    )
    workers = 1 if args.fault == "loader-worker" else 0
    trainer = Trainer(build_model(), lr=0.01)
    stop_thread = threading.Event()
    if faulty and args.fault == "gil-thread":
        threading.Thread(target=metrics_exporter, args=(stop_thread,), daemon=True).start()
    if faulty and args.fault == "threads":
        threading.Thread(target=preprocess_ahead, args=(stop_thread,), daemon=True).start()
    scratch = Path(tempfile.mkdtemp(prefix=f"fault-job-{rank}-"))
    if rank == 0:
        print(f"fault job: {args.fault} on ranks {fault_ranks}, {world} ranks", flush=True)

    step, started = 0, time.monotonic()
    step_random = random.Random(7)  # the same sequence on every rank
    rank_random = random.Random(100 + rank)
    for inputs, labels in epochs(dataset, batch, workers=workers):
        step += 1
        repeats = args.base_repeats
        if args.fault == "noisy-steps":
            repeats = step_random.choice((3, 6, 9, 12))
        if args.fault == "uneven":
            repeats = rank_random.choice((3, 12, 24, 48))
        augment(BASE_MATRIX, round(repeats * work_scale))
        if faulty:
            if args.fault in ("python-hotspot",) or (args.fault == "mixed" and index == 0):
                tokenize(batch, 90)
            if args.fault in ("compute", "slow-node") or (args.fault == "mixed" and index):
                extra_compute(BASE_MATRIX, args.extra_repeats)
            if args.fault == "intermittent" and step % 3 == 0:
                tokenize(batch, 270)
            if args.fault == "sleep":
                flush_metrics(0.02)
            if args.fault == "checkpoint" and step % 4 == 0:
                save_checkpoint(trainer.model.module, scratch / "checkpoint.pt")
            if args.fault == "logging" and step % 3 == 0:
                write_metrics_record(scratch / "metrics.log", step)
            if args.fault == "memory":
                cache_features(64)
        loss = trainer.step(inputs, labels)
        if step % SYNC_EVERY:
            continue
        late = time.monotonic() - started > args.max_seconds
        _, stop = agree(loss, late or bool(args.stop_file and os.path.exists(args.stop_file)))
        if stop:
            break
    stop_thread.set()
    shutil.rmtree(scratch, ignore_errors=True)  # the checkpoint and log faults write there
    if rank == 0:
        print(f"fault job: finished {step} steps in {time.monotonic() - started:.1f} s", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
    finish()  # destroys the process group and leaves (see its docstring)
