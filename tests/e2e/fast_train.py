"""A short, fast torchrun job (a step takes about a millisecond): DDP over gloo, --steps steps."""

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs = torch.randn(16, 32)
    for _ in range(args.steps):
        optimizer.zero_grad()
        model(inputs).sum().backward()
        optimizer.step()
    if dist.get_rank() == 0:
        print(f"fast job: {args.steps} steps done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
