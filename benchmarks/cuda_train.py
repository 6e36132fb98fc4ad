"""A CUDA training job with an injected fault on one rank, for checking perfdiag's CUDA side on
a GPU machine (scripts/gpu-check.sh runs it through `perfdiag run`).

    perfdiag run --nproc-per-node 2 -- benchmarks/cuda_train.py --scenario gpu-compute

A plain torchrun script (nothing of perfdiag's hook or API; the demo's MLP, optimizer step and
device choice: perfdiag.local.demo.ddp): DDP over gloo, every rank on the same GPU
(cuda:<local rank modulo the GPUs present>: one GPU serves both ranks, and NCCL refuses two
ranks on one device). Scenarios, and the category perfdiag should name for the fault rank:

  healthy       no fault                                                  (no culprit)
  gpu-compute   the fault rank runs extra matrix products on the GPU      gpu_compute
  host-bound    the fault rank launches thousands of tiny kernels and     cuda_runtime
                waits on `.item()` between them
  memcpy        every rank uploads a feature block each step; the fault   gpu_memory
                rank's comes from pageable memory, the others' from
                pinned memory with non_blocking copies

`--device cpu` runs the same loop without a GPU (a smoke test of the script itself).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist

from perfdiag.local.demo.ddp import CLASSES, Trainer, agree, build_model, finish, rank_device

SCENARIOS = ("healthy", "gpu-compute", "host-bound", "memcpy")
FEATURES = 1024
HIDDEN = 2048
SYNC_EVERY = 10


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", choices=SCENARIOS, default="healthy")
    parser.add_argument("--fault-rank", type=int, default=1)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--steps", type=int, default=60, help="train at least this many steps")
    parser.add_argument("--min-seconds", type=float, default=8.0, help="and at least this long")
    parser.add_argument("--max-seconds", type=float, default=300.0)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--matmuls", type=int, default=12, help="gpu-compute: extra products")
    parser.add_argument("--matmul-size", type=int, default=4096)
    parser.add_argument("--tiny-kernels", type=int, default=3000, help="host-bound: launches")
    parser.add_argument("--upload-mib", type=int, default=256, help="memcpy: MiB per step")
    return parser.parse_args(argv)


def extra_products(device: torch.device, size: int, repeats: int) -> torch.Tensor:
    generator = torch.Generator(device=device).manual_seed(7)
    a = torch.randn(size, size, device=device, generator=generator)
    b = torch.randn(size, size, device=device, generator=generator) / size**0.5
    for _ in range(repeats):
        a = torch.tanh(a @ b)
    return a


def tiny_kernels(device: torch.device, launches: int) -> float:
    """Host-bound GPU work: one-element kernels, with a device-to-host sync every 100."""
    x = torch.zeros(1, device=device)
    total = 0.0
    for i in range(launches):
        x.add_(1.0)
        if i % 100 == 99:
            total += x.item()
    return total


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = rank_device(args.device)
    faulty = args.scenario != "healthy" and rank == args.fault_rank
    torch.manual_seed(0)

    pin = device.type == "cuda"
    batches = [
        (torch.randn(args.batch_size, FEATURES), torch.randint(0, CLASSES, (args.batch_size,)))
        for _ in range(4)
    ]
    if pin:
        batches = [(x.pin_memory(), y.pin_memory()) for x, y in batches]
    upload = None
    if args.scenario == "memcpy":
        upload = torch.randn(args.upload_mib * 1024 * 1024 // 4)
        if pin and not faulty:
            upload = upload.pin_memory()
    trainer = Trainer(build_model(FEATURES, HIDDEN), lr=0.01, device=device)
    if rank == 0:
        fault = f" (fault on rank {args.fault_rank})" if args.scenario != "healthy" else ""
        print(f"cuda_train: {args.scenario}{fault}, {world} ranks on {device}", flush=True)

    step, started = 0, time.monotonic()
    while True:
        inputs, labels = batches[step % len(batches)]
        inputs = inputs.to(device, non_blocking=pin)
        labels = labels.to(device, non_blocking=pin)
        if upload is not None:
            # Pageable memory: the copy is staged through a driver buffer and blocks the host.
            features = upload.to(device, non_blocking=upload.is_pinned())
            inputs = inputs + features[: inputs.numel()].view_as(inputs) * 0.0
        if faulty and args.scenario == "gpu-compute":
            inputs = inputs + extra_products(device, args.matmul_size, args.matmuls).mean() * 0.0
        if faulty and args.scenario == "host-bound":
            tiny_kernels(device, args.tiny_kernels)
        loss = trainer.step(inputs, labels)
        step += 1
        if step % SYNC_EVERY:
            continue
        elapsed = time.monotonic() - started
        mean_loss, stop = agree(
            loss,
            elapsed >= args.max_seconds or (step >= args.steps and elapsed >= args.min_seconds),
        )
        if rank == 0 and step % 50 == 0:
            print(f"cuda_train: step {step} loss {mean_loss:.4f}", flush=True)
        if stop:
            break
    if rank == 0:
        print(f"cuda_train: finished {step} steps in {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
    finish()  # destroys the process group and leaves (see its docstring)
