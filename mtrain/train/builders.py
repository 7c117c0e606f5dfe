"""The parts a Trainer runs, each built from the typed `TrainConfig` in one visible place.

`build_parts` makes what one update needs: the network the step calls (model and loss,
wrapped in DDP and/or compiled), the fused AdamW, the learning-rate schedule, the fp16 loss
scaler, the batch source and the fault guards. `mtrain.train.setup` calls it for `mtrain fit`
and for every benchmark script, so a benchmark times exactly what a user runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mtrain.batches.guided_alignment import GuidedAlignments
from mtrain.config import Precision, TrainConfig
from mtrain.model import Seq2SeqTransformer
from mtrain.runtime import describe_device
from mtrain.tokenizer import SpecialIds
from mtrain.train.batch_source import BatchSource, TrainingCorpora
from mtrain.train.compilation import compile_network, shape_buckets, static_shapes
from mtrain.train.distributed import DistributedContext, data_parallel
from mtrain.train.ema import WeightAverage
from mtrain.train.faults import NonFiniteGuard, OutOfMemoryGuard
from mtrain.train.loss import GuidedHead, TranslationLoss
from mtrain.train.schedule import LearningRateSchedule


@dataclass
class TrainingParts:
    """What the trainer's update runs (built by `build_parts`)."""

    model: Seq2SeqTransformer  # the bare model: checkpoints, validation, statistics
    network: torch.nn.Module  # what the step calls: model + loss, DDP-wrapped and/or compiled
    optimizer: torch.optim.Optimizer
    schedule: LearningRateSchedule
    scaler: torch.amp.GradScaler
    batches: BatchSource
    non_finite: NonFiniteGuard
    out_of_memory: OutOfMemoryGuard
    device: torch.device
    precision: Precision
    ema: WeightAverage | None = None  # train.ema_decay's average of the weights
    cuda_graphs: bool = False  # the network's forward and backward replay CUDA graphs

    @property
    def validated_model(self) -> Seq2SeqTransformer:
        """What validation, best.pt and the test decode judge: the average when there is one."""
        return self.ema.module if self.ema is not None else self.model

    def describe(self, train_cfg: TrainConfig, ranks: int) -> str:
        """The line a fit starts with: the model's size, where and how it trains, the batch budget."""
        params = sum(p.numel() for p in self.model.parameters())
        return (
            f"model: {params / 1e6:.2f}M parameters | device {describe_device(self.device, train_cfg.tf32)} | "
            f"precision {self.precision} | {ranks} rank(s) | batch budget {train_cfg.max_tokens * train_cfg.update_freq * ranks} "
            f"tokens/update (max_tokens {train_cfg.max_tokens} x update_freq {train_cfg.update_freq} x ranks "
            f"{ranks}) | {self.batches.describe()}"
            + (
                " | compiled" + (" into CUDA graphs" if self.cuda_graphs else "")
                if train_cfg.compile or self.cuda_graphs
                else ""
            )
            + ("" if self.ema is None else f" | EMA of the weights, decay {self.ema.decay} (validated and decoded)")
        )


def batch_pad_multiple(
    configured: int | None, device: torch.device, precision: Precision, bucketed: bool = False
) -> int:
    """`train.pad_to_multiple`, with null resolved per device and precision (see its comment);
    shape buckets bound the shapes themselves, so there null is 1 (widths of any size)."""
    if configured is not None:  # config_checks has made sure it is >= 1
        return configured
    if bucketed:
        return 1
    if device.type == "cuda":
        return 8
    return 4 if precision is Precision.bf16 else 1


def build_network(
    model: Seq2SeqTransformer, train_cfg: TrainConfig, pad_id: int, dist: DistributedContext, device: torch.device
) -> torch.nn.Module:
    """The model and its loss as one module, in DDP under torchrun, compiled if asked. Compiled
    per shape (and under CUDA graphs) the loss projects every target position (pad rows weighted
    0), so that no shape depends on the batch's token count."""
    guided_head = None
    if train_cfg.guided_alignment is not None:
        guided_head = GuidedHead(
            train_cfg.guided_alignment_layer, train_cfg.guided_alignment_head, train_cfg.guided_alignment_weight
        )
    network: torch.nn.Module = TranslationLoss(
        model, pad_id, train_cfg.label_smoothing, static_rows=static_shapes(train_cfg), guided=guided_head
    )
    if dist.enabled:
        network = data_parallel(network, device)
    return compile_network(network, train_cfg)


def build_optimizer(model: torch.nn.Module, train_cfg: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        model.parameters(),
        lr=train_cfg.lr,
        betas=(train_cfg.betas[0], train_cfg.betas[1]),  # two: config_checks
        eps=train_cfg.eps,
        weight_decay=train_cfg.weight_decay,
        # one kernel per parameter instead of ~6 (CPU too: +2% per fp32 update, docs/PERFORMANCE.md)
        fused=device.type in ("cpu", "cuda") or None,
    )


def build_parts(
    model: Seq2SeqTransformer,
    train_cfg: TrainConfig,
    seed: int,
    corpora: TrainingCorpora,
    special_ids: SpecialIds,
    device: torch.device,
    precision: Precision,
    dist: DistributedContext | None = None,
    prefetch: bool | None = None,
    guided: GuidedAlignments | None = None,
) -> TrainingParts:
    """Everything an update needs. `corpora`: the training split's segmentations (one, or one
    per subword-sampling copy), or a `CorpusMixture` of several corpora (`training_corpora`);
    `prefetch` (default: on CUDA) collates the next batches in a background thread; on a CPU
    that thread would take cores from the update itself. `guided`: guided alignment's targets
    (train.guided_alignment), batched with the pairs and trained by the loss."""
    dist = dist or DistributedContext()
    buckets = shape_buckets(train_cfg)
    batches = BatchSource(
        corpora,
        special_ids,
        device,
        max_tokens=train_cfg.max_tokens,
        update_freq=train_cfg.update_freq,
        max_epochs=train_cfg.max_epochs,
        seed=seed,
        pad_to_multiple=batch_pad_multiple(train_cfg.pad_to_multiple, device, precision, bucketed=buckets > 0),
        shape_buckets=buckets,
        num_replicas=dist.world_size,
        rank=dist.rank,
        prefetch=device.type == "cuda" if prefetch is None else prefetch,
        guided=guided,
    )
    return TrainingParts(
        model=model,
        network=build_network(model, train_cfg, special_ids.pad, dist, device),
        optimizer=build_optimizer(model, train_cfg, device),
        schedule=LearningRateSchedule(train_cfg),
        scaler=torch.amp.GradScaler(device.type, enabled=precision is Precision.fp16),
        batches=batches,
        non_finite=NonFiniteGuard(train_cfg.max_bad_updates, device),
        out_of_memory=OutOfMemoryGuard(train_cfg.max_oom_batches),
        device=device,
        precision=precision,
        ema=None
        if train_cfg.ema_decay is None
        else WeightAverage(model, train_cfg.ema_decay, train_cfg.ema_start_update),
        cuda_graphs=train_cfg.cuda_graphs,
    )
