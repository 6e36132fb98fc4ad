"""Writes each rank's real torch Flight Recorder dump after rank --behind skipped the last
all-reduce the others issued (they issue it asynchronously, so nobody blocks)."""

import os
import sys

import torch
import torch._C._distributed_c10d as c10d
import torch.distributed as dist

out, behind = sys.argv[1], int(sys.argv[2])
dist.init_process_group("gloo")
rank = dist.get_rank()
tensor = torch.ones(8)
for _ in range(3):
    dist.all_reduce(tensor)
if rank != behind:
    dist.all_reduce(tensor, async_op=True)  # never matched by the rank that is behind
dump = getattr(c10d, "_dump_fr_trace", None) or c10d._dump_nccl_trace
with open(os.path.join(out, f"rank-{rank}.pkl"), "wb") as fh:
    fh.write(dump())
os._exit(0)  # the unmatched all-reduce must not be waited for at shutdown
