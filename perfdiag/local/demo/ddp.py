"""The parts of a data-parallel training job that the demo's script (`train.py`) shares with
perfdiag's own test and benchmark jobs (the fault suite's job, benchmarks/cuda_train.py,
benchmarks/gpu_transformer_train.py): an MLP, synthetic data read through a real DataLoader,
DDP with SGD, the all-reduce through which the ranks log the loss and agree to stop, each
rank's device, and how a rank ends.

It runs in the training processes: torch and the standard library only. Each job keeps its
own loop and its faults, so that the functions a diagnosis names are the job's own code,
called from its loop as a user's would be.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import time
from collections.abc import Iterator
from typing import NoReturn

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

FEATURES = 256
HIDDEN = 256
CLASSES = 16

Labelled = tuple[torch.Tensor, torch.Tensor]
"""Inputs and their labels: one sample, or a batch of them."""


class SyntheticDataset(Dataset[Labelled]):
    """Deterministic random samples; `read_delay_s` simulates slow storage per sample."""

    def __init__(self, size: int, read_delay_s: float = 0.0) -> None:
        self.size = size
        self.read_delay_s = read_delay_s
        generator = torch.Generator().manual_seed(1234)
        self.inputs = torch.randn(size, FEATURES, generator=generator)
        self.labels = torch.randint(0, CLASSES, (size,), generator=generator)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> Labelled:
        if self.read_delay_s:
            time.sleep(self.read_delay_s)
        return self.inputs[index], self.labels[index]


def build_model(features: int = FEATURES, hidden: int = HIDDEN) -> nn.Module:
    return nn.Sequential(
        nn.Linear(features, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, CLASSES),
    )


def epochs(dataset: Dataset[Labelled], batch_size: int, *, workers: int = 0) -> Iterator[Labelled]:
    """This rank's share of `dataset` in batches, epoch after epoch, without end."""
    sampler: DistributedSampler[int] = DistributedSampler(
        dataset, num_replicas=dist.get_world_size(), rank=dist.get_rank(), seed=0
    )
    loader = DataLoader(
        dataset, batch_size=batch_size, sampler=sampler, drop_last=True, num_workers=workers
    )
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


class Trainer:
    """The model under DDP (on `device`, the CPU by default), SGD with momentum, cross-entropy."""

    def __init__(self, model: nn.Module, lr: float, device: torch.device | None = None) -> None:
        on_gpu = device is not None and device.type == "cuda"
        self.model = DistributedDataParallel(
            model.to(device) if device is not None else model,
            device_ids=[device.index] if on_gpu and device is not None else None,
        )
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=0.9)
        self.loss_fn = nn.CrossEntropyLoss()

    def step(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """One optimizer step on a batch; its loss."""
        self.optimizer.zero_grad(set_to_none=True)
        loss: torch.Tensor = self.loss_fn(self.model(inputs), labels)
        loss.backward()  # type: ignore[no-untyped-call]
        self.optimizer.step()
        return loss


def agree(loss: torch.Tensor, stop: bool) -> tuple[float, bool]:
    """The loss averaged over the ranks, and whether any rank asks to stop: one all-reduce, as
    training loops do every few steps for logging (not every step: a blocking collective per
    step would make the ranks that arrive first wait in it, on top of DDP's own)."""
    flags = torch.tensor([loss.item(), float(stop)])
    dist.all_reduce(flags)
    return flags[0].item() / dist.get_world_size(), flags[1].item() > 0


def rank_device(kind: str) -> torch.device:
    """ "cuda": cuda:<local rank modulo the GPUs present> (one GPU serves several ranks, as NCCL
    would refuse two ranks on one device, hence gloo); "cpu": the CPU, one thread per rank."""
    if kind == "cuda":
        index = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    torch.set_num_threads(1)
    return torch.device("cpu")


def finish(code: int = 0) -> NoReturn:
    """End this rank: destroy the process group, run the exit handlers, flush, and leave
    without interpreter finalization.

    DDP keeps the process group, and with it gloo's native threads, alive past
    destroy_process_group; a native thread that touches a Python object while the interpreter
    is being finalized aborts a rank whose training had finished ("terminate called without an
    active exception", rare, seen on a loaded host). perfdiag's own command leaves the same way
    for the same class of abort (perfdiag.cli.exit_now)."""
    dist.destroy_process_group()
    atexit._run_exitfuncs()  # the handlers a normal exit runs (perfdiag's hook has one)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)
