"""DDP through torchrun: process-group setup and the few collectives the trainer needs.

`mtrain fit` runs unchanged with or without torchrun: without the torchrun environment
variables the context is a single process (rank 0 of 1) and every helper is a no-op.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


@dataclass
class DistributedContext:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

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


def data_parallel(network: torch.nn.Module, device: torch.device) -> DistributedDataParallel:
    """`network` in DDP, whose one collective per update is its gradient reduction (one per bucket).

    Its buffers (position tables, the output vocabulary's mask) are constants built alike on every
    rank: DDP's default broadcast of them from rank 0 before every forward would be a collective
    per batch, so it is turned off (DDP still syncs them once as it wraps the network)."""
    device_ids = [device.index] if device.type == "cuda" else None
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters:
        return DistributedDataParallel(network, device_ids=device_ids, forward_sync_buffers=False)
    return DistributedDataParallel(network, device_ids=device_ids, broadcast_buffers=False)  # torch before 2.13


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
    if world_size <= 1:
        return DistributedContext()
    rank = launched_rank()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() and device_name != "cpu"
    if use_cuda:
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo", timeout=timedelta(minutes=30))
    return DistributedContext(rank=rank, local_rank=local_rank, world_size=world_size)


def shutdown_distributed(context: DistributedContext) -> None:
    if context.enabled and dist.is_initialized():
        dist.destroy_process_group()
