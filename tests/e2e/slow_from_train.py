"""A torchrun job whose rank 1 turns slow at --slow-from (a blocking call in `flush_metrics`)."""

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def flush_metrics() -> None:
    time.sleep(0.008)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--slow-from", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DistributedDataParallel(nn.Linear(64, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs = torch.randn(32, 64)
    for step in range(args.steps):
        optimizer.zero_grad()
        model(inputs).sum().backward()
        optimizer.step()
        time.sleep(0.01)
        if rank == 1 and step >= args.slow_from:
            flush_metrics()
    if rank == 0:
        print(f"slow-from job: {args.steps} steps done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
