"""A DDP script whose rank 3 runs its own torch.profiler the whole time: perfdiag's hook cannot
profile that rank (one profiler per process), the others are captured."""

import contextlib
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
model = DistributedDataParallel(nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 8)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
own_profiler = (
    torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    if rank == 3
    else contextlib.nullcontext()
)
started = time.monotonic()
with own_profiler:
    step = 0
    while True:
        optimizer.zero_grad()
        model(torch.randn(64, 128)).sum().backward()
        optimizer.step()
        step += 1
        if step % 10 == 0:  # the ranks stop together, after 8 s
            done = torch.tensor([float(time.monotonic() - started > 8.0)])
            dist.all_reduce(done)
            if done.item() > 0:
                break
dist.destroy_process_group()
