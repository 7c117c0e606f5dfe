"""DDP through torchrun: process-group setup and the few collectives the trainer needs.

`mtrain fit` runs unchanged with or without torchrun: without the torchrun environment
variables the context is a single process (rank 0 of 1) and every helper is a no-op. Under
torchrun even one process joins a process group and trains in DDP (a group of one: what the GPU
session's DDP step runs to have NCCL run on a machine with one GPU).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from mtrain.durations import format_duration
from mtrain.errors import MtrainError

if TYPE_CHECKING:
    from mtrain.train.budget import EndCost

log = logging.getLogger("mtrain")


@dataclass
class DistributedContext:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    backend: str = ""  # "nccl" or "gloo" under DDP
    timeout_seconds: float = 0.0  # the longest one collective waits (train.ddp_timeout)
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

    def describe(self, solo_work: EndCost | None) -> str:
        """What a collective waits for at most, against rank 0's solo work (`solo_work`: measured
        under train.max_time, else None): 'DDP: 2 ranks (gloo); a collective waits at most 30m ...'."""
        limit = format_duration(self.timeout_seconds)
        line = (
            f"DDP: {self.world_size} ranks ({self.backend}); a collective waits at most {limit} "
            f"(train.ddp_timeout), which must cover rank 0's solo work (validation, checkpoints, test decode)"
        )
        if solo_work is None:
            return line + ": not estimated (no train.max_time)"
        longest = max(solo_work.validation + solo_work.save, solo_work.test)
        line += f", estimated at {solo_work.describe()}"
        if longest > self.timeout_seconds:
            line += f": raise train.ddp_timeout above {format_duration(longest)}, or the other ranks give up"
        return line

    @contextlib.contextmanager
    def watching_peers(self, phase: Callable[[], str]) -> Iterator[None]:
        """Within, a collective that fails as another rank died or hung raises its one-line
        MtrainError (`peer_failure`); `phase()` says where this rank stood."""
        try:
            yield
        except Exception as error:
            gone = self.peer_failure(error, phase())
            if gone is None:
                raise
            raise gone from None

    def peer_failure(self, error: BaseException, phase: str) -> MtrainError | None:
        """The one-line error of a collective that failed as another rank died or hung (None:
        `error` is something else): which rank is gone where it can be told, and the cause."""
        text = str(error)
        said_by_backend = isinstance(error, dist.DistError) or (
            type(error) is RuntimeError and _PEER_GONE.search(text) is not None  # gloo raises plain RuntimeErrors
        )
        if not self.enabled or not said_by_backend:
            return None
        others = [rank for rank in range(self.world_size) if rank != self.rank]
        who = f"rank {others[0]}" if len(others) == 1 else "another rank"
        cause = text.strip().splitlines()[0] if text.strip() else type(error).__name__
        cause = re.sub(r"^\[[^\]]*\] ", "", cause).split(". ")[0]  # without gloo's source location and advice
        return MtrainError(
            f"rank {self.rank}: {who} is gone ({self.backend}: {cause[:200]}) during {phase}; the job stops "
            "(train.resume=true continues from the last checkpoint)"
        )


def data_parallel(network: torch.nn.Module, device: torch.device) -> DistributedDataParallel:
    """`network` in DDP, whose one collective per update is its gradient reduction (one per bucket).

    Its buffers (position tables, the output vocabulary's mask) are constants built alike on every
    rank: DDP's default broadcast of them from rank 0 before every forward would be a collective
    per batch, so it is turned off (DDP still syncs them once as it wraps the network)."""
    device_ids = [device.index] if device.type == "cuda" else None
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters:
        return DistributedDataParallel(network, device_ids=device_ids, forward_sync_buffers=False)
    return DistributedDataParallel(network, device_ids=device_ids, broadcast_buffers=False)  # torch before 2.13


# How gloo and NCCL say that a peer is gone or does not answer (besides torch's DistError types).
_PEER_GONE = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|timed out|Timed out|NCCL error"
)


def _collective_device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def launched_rank() -> int:
    """This process's rank as torchrun set it (0 without torchrun), known before the group is joined."""
    return int(os.environ.get("RANK", "0"))


def init_distributed(device_name: str, timeout_seconds: float) -> DistributedContext:
    """Join the process group torchrun describes (nccl on GPU, gloo on CPU), whose collectives
    wait at most `timeout_seconds` for a rank (train.ddp_timeout)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1 and "TORCHELASTIC_RUN_ID" not in os.environ:  # torchrun sets it, even for one process
        return DistributedContext()
    rank = launched_rank()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() and device_name != "cpu"
    if use_cuda:
        torch.cuda.set_device(local_rank)
    backend = "nccl" if use_cuda else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_seconds))
    log.info("torch.distributed: rank %d of %d, backend %s (DDP)", rank, world_size, dist.get_backend())
    return DistributedContext(rank, local_rank, world_size, backend, timeout_seconds, joined=True)


def shutdown_distributed(context: DistributedContext) -> None:
    if context.enabled and dist.is_initialized():
        dist.destroy_process_group()
