"""The demo training job: data-parallel (DDP, gloo, CPU) training of a small MLP on synthetic
data read through a real torch DataLoader, with an optional injected fault on one rank.

A plain torchrun script: nothing of perfdiag's hook, API or launcher is in it (its model, data
and optimizer step are perfdiag.local.demo.ddp's, shared with perfdiag's own test jobs):

    torchrun --nproc-per-node 4 train.py --scenario python-hotspot --fault-rank 2

Scenarios (see perfdiag/local/demo/scenarios.py for what perfdiag should conclude):
  healthy            no fault
  python-hotspot     the fault rank runs a pure-Python "tokenizer" over each batch
  compute-straggler  the fault rank runs extra matrix multiplications (aten work) each step
  slowdown           the fault rank turns slow at step 100 (the tokenizer from then on), or
                     once --slowdown-file exists
  dataloader-stall   the fault rank's Dataset.__getitem__ is slow (a simulated slow read)

It trains at least --steps steps and at least --min-seconds seconds, so the run is long enough
for a diagnosis window however fast or loaded the machine is; with --stop-file it trains until
that file appears instead (`perfdiag demo` creates it once the verdict is out). Ranks agree on
when to stop through the per-step loss all-reduce that training loops commonly do for logging.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist

from perfdiag.local.demo.ddp import SyntheticDataset, Trainer, agree, build_model, epochs, finish

SCENARIOS = ("healthy", "python-hotspot", "compute-straggler", "slowdown", "dataloader-stall")
SLOWDOWN_STEP = 100  # perfdiag.local.demo.scenarios.SLOWDOWN_STEP (not imported: it loads pydantic)
SYNC_EVERY = 10


def tokenize(batch_size: int, words_per_sample: int) -> int:
    """A pure-Python text pipeline of the kind that ends up on the training thread.

    Its inner loop calls no function, so that with Python stacks on, the profile holds one
    event per call of `tokenize` rather than one per word."""
    vocabulary: dict[str, int] = {}
    total = 0
    for sample in range(batch_size):
        for position in range(words_per_sample):
            word = f"w{(sample * 31 + position * 17) % 997}"
            if word not in vocabulary:
                vocabulary[word] = total % 9973
            total += vocabulary[word] % 7
    return total


def extra_compute(size: int, repeats: int) -> torch.Tensor:
    """Additional aten work (matrix products) the fault rank does each step."""
    a = torch.randn(size, size)
    b = torch.randn(size, size)
    for _ in range(repeats):
        a = torch.tanh(a @ b)
    return a


def should_stop(args: argparse.Namespace, step: int, started: float) -> bool:
    elapsed = time.monotonic() - started
    if elapsed >= args.max_seconds:
        return True
    if args.stop_file:
        return os.path.exists(args.stop_file)
    return bool(step >= args.steps and elapsed >= args.min_seconds)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", choices=SCENARIOS, default="healthy")
    parser.add_argument("--fault-rank", type=int, default=2, help="rank with the fault")
    parser.add_argument("--steps", type=int, default=60, help="train at least this many steps")
    parser.add_argument(
        "--min-seconds", type=float, default=6.0, help="and train at least this long"
    )
    parser.add_argument(
        "--stop-file", default=None, help="train until this file exists (overrides the above)"
    )
    parser.add_argument("--max-seconds", type=float, default=900.0, help="never train longer")
    parser.add_argument(
        "--slowdown-file",
        default=None,
        help=f"slowdown scenario: turn slow once this file exists (not at step {SLOWDOWN_STEP})",
    )
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--log-every", type=int, default=50, help=f"a multiple of {SYNC_EVERY}")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)  # several ranks share a few cores
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    faulty = args.scenario != "healthy" and rank == args.fault_rank
    torch.manual_seed(0)

    read_delay = 0.00004 if faulty and args.scenario == "dataloader-stall" else 0.0
    dataset = SyntheticDataset(args.batch_size * world * 16, read_delay_s=read_delay)
    trainer = Trainer(build_model(), lr=args.lr)
    if rank == 0:
        fault = f" (fault on rank {args.fault_rank})" if args.scenario != "healthy" else ""
        print(f"demo: {args.scenario}{fault}, {world} ranks", flush=True)

    step, started, slow = 0, time.monotonic(), False
    for inputs, labels in epochs(dataset, args.batch_size):
        if faulty and args.scenario == "slowdown" and not slow:
            slow = (
                os.path.exists(args.slowdown_file) if args.slowdown_file else step >= SLOWDOWN_STEP
            )
        if faulty and (args.scenario == "python-hotspot" or slow):
            tokenize(args.batch_size, 290)
        if faulty and args.scenario == "compute-straggler":
            extra_compute(256, 28)
        loss = trainer.step(inputs, labels)
        step += 1
        if step % SYNC_EVERY:
            continue
        # Every few steps, the mean loss for logging and the shared decision to stop (any rank
        # may say so).
        mean_loss, stop = agree(loss, should_stop(args, step, started))
        if rank == 0 and step % args.log_every == 0:
            print(f"demo: step {step} loss {mean_loss:.4f}", flush=True)
        if stop:
            break
    if rank == 0:
        print(f"demo: finished {step} steps in {time.monotonic() - started:.1f} s", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
    finish()  # destroys the process group and leaves (see its docstring)
