"""The compiled update: `train.compile`, `train.cuda_graphs`, and how often torch.compile compiled.

`compile_network` wraps the network the step calls (model + loss) in `torch.compile` with
dynamic shapes, so that one graph serves every batch shape; with `train.cuda_graphs` in the
"reduce-overhead" mode, which records a CUDA graph of the compiled forward and backward per
batch shape and replays it: one launch instead of ~700 kernels (docs/PERFORMANCE.md, GPU).
Shape buckets (`train.shape_buckets`, mtrain.batches.buckets) keep those shapes few.

Dynamo compiles again when a guard fails (a size it specialised on, such as a dimension of
1 or two sizes that happened to be equal); `compiled_graphs` counts what it built, and
`GraphLog` logs each new one the trainer's updates built with the batch shape that caused it.
"""

from __future__ import annotations

import logging

import torch

from mtrain.batches import Batch
from mtrain.config import TrainConfig
from mtrain.errors import MtrainError

log = logging.getLogger("mtrain")


def compiling(train_cfg: TrainConfig) -> bool:
    return train_cfg.compile or train_cfg.cuda_graphs


def check_cuda_graphs(train_cfg: TrainConfig, device: torch.device) -> None:
    """Refuse CUDA graphs on a device that has none."""
    if train_cfg.cuda_graphs and device.type != "cuda":
        raise MtrainError(
            f"train.cuda_graphs=true needs a CUDA device, but this run trains on {device.type}; "
            "set train.cuda_graphs=false (train.compile=true compiles without graphs)"
        )


def shape_buckets(train_cfg: TrainConfig) -> int:
    """`train.shape_buckets` with null resolved: 8 when compiling, else 0 (off)."""
    if train_cfg.shape_buckets is not None:
        return train_cfg.shape_buckets
    return 8 if compiling(train_cfg) else 0


def compile_network(network: torch.nn.Module, train_cfg: TrainConfig) -> torch.nn.Module:
    """`network` compiled as the config asks (or as it is)."""
    if not compiling(train_cfg):
        return network
    mode = "reduce-overhead" if train_cfg.cuda_graphs else None
    return torch.compile(network, dynamic=True, mode=mode)  # type: ignore[return-value]


def begin_graph_step() -> None:
    """Tell CUDA graph trees that a new forward begins: the outputs of the last replay may be
    overwritten (the step has read them). Cheap; needed when forwards run back to back."""
    torch.compiler.cudagraph_mark_step_begin()  # type: ignore[no-untyped-call]  # (torch: no annotation)


def compiled_graphs() -> int:
    """Graphs torch.compile has built in this process (frames compiled, recompiles included)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"].get("unique_graphs", 0))


class GraphLog:
    """The graphs torch.compile built for one trainer (recompiles included; dynamo counts per
    process): `after_update` logs each update that built one, the first (tracing and code
    generation) and every recompile, with the batch shape that caused it."""

    def __init__(self) -> None:
        self.built = 0
        self._before = compiled_graphs()

    def after_update(self, update: int, batch: Batch, seconds: float) -> None:
        graphs = compiled_graphs() - self._before
        if graphs > self.built:
            rows, src_len = batch.src_tokens.shape
            log.info(
                "torch.compile: update %d built graph %d (%s, batch %dx%dx%d: rows x src_len x tgt_len) in %.1f s",
                update,
                graphs,
                "the first" if self.built == 0 else "a recompile",
                rows,
                src_len,
                batch.tgt_input.shape[1],
                seconds,
            )
            self.built = graphs
