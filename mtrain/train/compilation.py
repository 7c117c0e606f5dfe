"""The compiled update: `train.compile`, `train.cuda_graphs`, and how often torch.compile compiled.

`compile_network` wraps the network the step calls (model + loss) in `torch.compile`; with
`train.cuda_graphs` in the "reduce-overhead" mode, which records a CUDA graph of the compiled
forward and backward per batch shape and replays it: one launch instead of ~700 kernels
(docs/PERFORMANCE.md, GPU).

Shape buckets (`train.shape_buckets`, mtrain.batches.buckets; on by default when compiling)
make every batch one of a few shapes known in advance, and then each shape is compiled
statically (`dynamic=False`): one graph per bucket, its kernels specialised to its sizes, the
loss's chunk count fixed per bucket (mtrain.train.loss), and the loss weighting the pad rows
instead of selecting the others by a token count that changes every batch (`static_shapes`).
Dynamo's recompile limit (8 graphs of one function) is raised to keep a graph for every bucket.
Without buckets the shapes are unbounded, and one dynamic graph serves them all.

Dynamo compiles again when a guard fails (a new shape, or a batch without source padding,
whose attention runs unmasked: mtrain.model.attention); `compiled_graphs` counts what it built,
and `GraphLog` logs each new one the trainer's updates built with the batch shape that caused it.
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


def static_shapes(train_cfg: TrainConfig) -> bool:
    """Whether the network is compiled per batch shape (compiling, with shape buckets): then no
    input may vary from batch to batch within a shape, so the loss projects every target
    position and weights the pad rows 0 (`TranslationLoss(static_rows=True)`)."""
    return compiling(train_cfg) and shape_buckets(train_cfg) > 0


# Graphs kept per compiled function: a bucket's batches bring its shape with and without source
# padding, and a mixture of corpora brings new row counts each epoch. Beyond, dynamo falls back
# to eager for new shapes (and warns).
GRAPHS_PER_BUCKET = 4


def compile_network(network: torch.nn.Module, train_cfg: TrainConfig) -> torch.nn.Module:
    """`network` compiled as the config asks (or as it is): per shape with shape buckets, else dynamic."""
    if not compiling(train_cfg):
        return network
    mode = "reduce-overhead" if train_cfg.cuda_graphs else None
    static = static_shapes(train_cfg)
    if static:
        limit = GRAPHS_PER_BUCKET * shape_buckets(train_cfg)
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, limit)
    return torch.compile(network, dynamic=not static, mode=mode)  # type: ignore[return-value]


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
