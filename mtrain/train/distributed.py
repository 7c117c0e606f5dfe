"""DDP through torchrun: process-group setup and the few collectives the trainer needs.

`mtrain fit` runs unchanged with or without torchrun: without the torchrun environment
variables the context is a single process (rank 0 of 1) and every helper is a no-op. Under
torchrun even one process joins a process group and trains in DDP (a group of one: what the GPU
session's DDP step runs to have NCCL run on a machine with one GPU).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

log = logging.getLogger("mtrain")


@dataclass
class DistributedContext:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    joined: bool = False  # in a process group (under torchrun), even a group of one

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1 or self.joined

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def sum(self, value: float) -> float:
        """Sum a Python number over all ranks."""
        return self.sum_each([value])[0]

    def sum_each(self, values: Sequence[float]) -> list[float]:
        """Sum each of several Python numbers over all ranks, in one collective."""
        if not self.enabled:
            return list(values)
        tensor = torch.tensor(list(values), dtype=torch.float64, device=_collective_device())
        dist.all_reduce(tensor)
        return tensor.tolist()

    def broadcast_from_main(self, value: float) -> float:
        """Rank 0's value of a Python number, on every rank."""
        return self.sum(value if self.is_main else 0.0)

    def any(self, flag: bool) -> bool:
        """True on every rank when `flag` is True on any rank (e.g. a stop request)."""
        return self.sum(1.0 if flag else 0.0) > 0


def _collective_device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def launched_rank() -> int:
    """This process's rank as torchrun set it (0 without torchrun), known before the group is joined."""
    return int(os.environ.get("RANK", "0"))


def init_distributed(device_name: str) -> DistributedContext:
    """Join the process group torchrun describes (nccl on GPU, gloo on CPU)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1 and "TORCHELASTIC_RUN_ID" not in os.environ:  # torchrun sets it, even for one process
        return DistributedContext()
    rank = launched_rank()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() and device_name != "cpu"
    if use_cuda:
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo", timeout=timedelta(minutes=30))
    log.info("torch.distributed: rank %d of %d, backend %s (DDP)", rank, world_size, dist.get_backend())
    return DistributedContext(rank=rank, local_rank=local_rank, world_size=world_size, joined=True)


def shutdown_distributed(context: DistributedContext) -> None:
    if context.enabled and dist.is_initialized():
        dist.destroy_process_group()
