"""A torchrun training script (gloo, CPU) that hangs on purpose, for the hang tests.

--mode before-allreduce: rank --rank blocks forever after its backward pass, before the
    all-reduce of the gradients that every other rank then waits in.
--mode dataloader: rank --rank blocks forever inside its Dataset.__getitem__ (DataLoader with
    no worker processes, so the training thread is inside the loader).
--mode slow: nothing hangs; every step sleeps --step-seconds, and rank --rank pauses
    --pause-seconds once at step --at-step (a checkpoint, say): slow, not stuck.
The gradients are all-reduced explicitly (no DDP), as a user's own loop would.
"""

import argparse
import threading
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

BLOCK = threading.Event()  # never set: wait() blocks forever, releasing the GIL


class Samples(Dataset):  # type: ignore[type-arg]
    def __init__(self, stall_rank: int, stall_after: int) -> None:
        self.stall_rank = stall_rank
        self.stall_after = stall_after
        self.served = 0

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.served += 1
        if dist.get_rank() == self.stall_rank and self.served > self.stall_after:
            read_shard_blocking()
        return torch.randn(64), torch.tensor(index % 10)


def read_shard_blocking() -> None:
    BLOCK.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["before-allreduce", "dataloader", "slow"])
    parser.add_argument("--rank", type=int, default=1)
    parser.add_argument("--at-step", type=int, default=3)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--step-seconds", type=float, default=0.0)
    parser.add_argument("--pause-seconds", type=float, default=0.0)
    args = parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    batch = 16
    stall_rank = args.rank if args.mode == "dataloader" else -1
    loader = DataLoader(Samples(stall_rank, args.at_step * batch), batch_size=batch)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = iter(loader)
    for step in range(args.steps):
        inputs, labels = next(batches)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(inputs), labels).backward()
        if args.mode == "before-allreduce" and rank == args.rank and step == args.at_step:
            BLOCK.wait()
        if args.mode == "slow":
            time.sleep(args.step_seconds)
            if rank == args.rank and step == args.at_step:
                time.sleep(args.pause_seconds)
        for param in model.parameters():
            dist.all_reduce(param.grad)
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
