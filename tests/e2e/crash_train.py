"""A DDP training script whose rank 1 fails at step 3 (for the failure tests)."""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

torch.set_num_threads(1)
dist.init_process_group("gloo")
model = DistributedDataParallel(nn.Linear(64, 8))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(1, 1000):
    if dist.get_rank() == 1 and step == 3:
        raise RuntimeError(f"injected failure at step {step}")
    optimizer.zero_grad()
    model(torch.randn(16, 64)).sum().backward()
    optimizer.step()
