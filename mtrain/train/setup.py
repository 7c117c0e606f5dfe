"""One setup: a composed fit config -> the machine, the prepared data, the model, a ready Trainer.

`mtrain fit` and every script under `scripts/` build through here, so a benchmark measures the
update a user runs. Three steps, because `mtrain fit` checks and writes its run directory
between the second and the third (nothing is written before every refusal has had its say):

1. `resolve_machine`: device, training and decoding precision (resolved once), threads;
2. `prepare_fit_data`: tokenizer and encoded corpora (rank 0 first, from the cache);
3. `build_fit`: the model (seeded, or a parent's weights with init_from; its softmax restricted
   as configured), the trainer's parts,
   its checkpointer and metric logger when there is a run directory, a resumed state.

`setup_fit` runs all three, for scripts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mtrain.batches import EncodedCorpus, PreparedData, prepare_data
from mtrain.batches.guided_alignment import load_guided_alignments
from mtrain.batches.term_training import load_term_training
from mtrain.config import FitConfig, Positions, Precision, to_plain
from mtrain.durations import parse_duration
from mtrain.errors import MtrainError
from mtrain.model import Seq2SeqTransformer, build_model
from mtrain.rundir import RunDir
from mtrain.runtime import decode_precision_of_training, resolve_device, resolve_precision, set_tf32, set_threads
from mtrain.tokenizer import Tokenizer
from mtrain.train.batch_source import training_corpora
from mtrain.train.budget import EndCost, RunBudget
from mtrain.train.builders import build_parts
from mtrain.train.checkpointer import Checkpointer, data_fingerprints
from mtrain.train.compilation import check_cuda_graphs
from mtrain.train.distributed import DistributedContext
from mtrain.train.faults import StopSignal
from mtrain.train.host_memory import HOST_MEMORY_TRIM_EVERY, HostMemory
from mtrain.train.init_from import Lineage, Parent, keep_parent_optimizer, load_parent_weights, output_pieces
from mtrain.train.metric_log import MetricLogger
from mtrain.train.output_vocab import restrict_to_training_targets
from mtrain.train.random_state import seed_everything
from mtrain.train.throughput import peak_flops
from mtrain.train.trainer import Trainer, Validate, no_validation

log = logging.getLogger("mtrain")

# What builds a run's validation from its model (mtrain fit's: loss and BLEU, mtrain.cli.fit).
# It is given the model validation judges and the trained one: the same model, or with
# train.ema_decay the weights' average and the trained weights (whose loss is logged beside).
ValidationFactory = Callable[[Seq2SeqTransformer, Seq2SeqTransformer], Validate]
# What measures, under train.max_time, the cost of what follows training, given the same two models
# (mtrain fit's: `fit_scoring.end_cost_estimate`).
EndCostFactory = Callable[[Seq2SeqTransformer, Seq2SeqTransformer], Callable[[], EndCost]]


@dataclass(frozen=True)
class Machine:
    """Where and how a fit runs, each resolved once."""

    device: torch.device
    precision: Precision  # training's
    decode_precision: Precision  # validation BLEU's and the test decode's
    dist: DistributedContext


@dataclass
class FitSetup:
    machine: Machine
    data: PreparedData
    model: Seq2SeqTransformer
    trainer: Trainer


def resolve_machine(cfg: FitConfig, dist: DistributedContext | None = None) -> Machine:
    """The device (the local rank's GPU under torchrun), the precisions and the CPU threads."""
    dist = dist or DistributedContext()
    device = resolve_device(cfg.train.device, dist.local_rank)
    precision = resolve_precision(cfg.train.precision, device)
    check_cuda_graphs(cfg.train, device)
    set_tf32(device, cfg.train.tf32)
    set_threads(cfg.train.num_threads)
    return Machine(device, precision, decode_precision_of_training(precision, device), dist)


def prepare_fit_data(
    cfg: FitConfig, machine: Machine, progress: Callable[[str], Any] = log.info, tokenizer: Tokenizer | None = None
) -> PreparedData:
    """Rank 0 prepares (tokenizer, encoded cache) and reports `progress`; the others then read
    the same cache. Validation and test pairs longer than the model embeds are refused.
    A given `tokenizer` (init_from: the parent's) encodes the data; none is trained."""
    dist = machine.dist
    if dist.is_main:
        data = prepare_data(cfg.data, cfg.tokenizer, log=progress, tokenizer=tokenizer)
    dist.barrier()
    if not dist.is_main:
        data = prepare_data(cfg.data, cfg.tokenizer, log=lambda *_: None, tokenizer=tokenizer)
    check_eval_lengths(data, cfg)
    if cfg.train.guided_alignment is not None:  # refused here, before the run directory is written
        assert isinstance(data.train, EncodedCorpus)  # one corpus (config_checks)
        data.guided_alignment = load_guided_alignments(
            cfg.train.guided_alignment, data.train, data.directory, data.tokenizer, cfg.data.train_limit
        )
    if cfg.train.term_alignment is not None:  # term-aware training: sources annotated once, from the seed
        assert isinstance(data.train, EncodedCorpus)  # one corpus (config_checks)
        data.train, annotation = load_term_training(
            data.train, data.directory, data.tokenizer, cfg.train, cfg.seed, cfg.data.train_limit
        )
        progress(annotation.summary())
    return data


def build_fit(
    cfg: FitConfig,
    machine: Machine,
    data: PreparedData,
    *,
    run: RunDir | None = None,
    validation: ValidationFactory | None = None,
    end_cost: EndCostFactory | None = None,
    started: float | None = None,
    resume_state: dict[str, Any] | None = None,
    stop_signal: StopSignal | None = None,
    host_memory_trim_every: int | None = None,
    model: Seq2SeqTransformer | None = None,
    init: Parent | None = None,
    lineage: Lineage | None = None,
) -> FitSetup:
    """The model and a ready trainer on `data`. With `run` (rank 0), checkpoints and metrics go
    there; `resume_state` (a checked checkpoint) continues; `host_memory_trim_every` overrides the
    default (every 10 updates on a CPU, never on a GPU); `model` replaces the one `cfg.model`
    builds (a benchmark's synthetic vocabulary). `init` (init_from) gives the model its parent's
    weights (and Adam's moments with init_keep_optimizer); `lineage`, what every checkpoint
    records of the parent (init's, or a resumed fine-tune's own record). `started`: when the
    command started (`time.monotonic()`; default now), where train.max_time counts from;
    `end_cost` measures what follows training (under max_time)."""
    device, dist = machine.device, machine.dist
    tokenizer = data.tokenizer
    seed_everything(cfg.seed)
    if model is None:
        model = build_model(
            cfg.model, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, tokenizer.pad_id, joint_vocab=tokenizer.joint
        )
        if init is not None:
            load_parent_weights(model, init)
        restrict_to_training_targets(
            model,
            cfg.model.output_vocab,
            data.train,
            tokenizer.special_ids,
            copies=[*data.train_copies, *(part.corpus for part in data.train_parts)],
            keep=output_pieces(init),
        )
    model = model.to(device)
    parts = build_parts(
        model,
        cfg.train,
        cfg.seed,
        training_corpora(data, cfg.data.sampling_temperature),
        tokenizer.special_ids,
        device,
        machine.precision,
        dist,
        guided=data.guided_alignment,
    )
    if init is not None:
        keep_parent_optimizer(parts.optimizer, init)
    lineage = lineage if lineage is not None else init.lineage if init is not None else None
    checkpointer = metrics = None
    if run is not None and dist.is_main:
        checkpointer = Checkpointer(run, cfg.train.keep_last, parse_duration(cfg.train.save_every, "train.save_every"))
        checkpointer.remove_stale_temporary_files()
        metrics = MetricLogger(
            run.tensorboard_dir,
            cfg.train.max_updates,
            resume_state["update"] if resume_state else 0,
            model.flops_per_token,
            peak_flops(device, machine.precision),
            ranks=dist.world_size,
            log_every_seconds=parse_duration(cfg.train.log_every_time, "train.log_every_time"),
            loss_every=cfg.train.loss_every,
        )
    if host_memory_trim_every is None:
        host_memory_trim_every = HOST_MEMORY_TRIM_EVERY if device.type == "cpu" else 0
    trainer = Trainer(
        cfg.train,
        parts,
        dist,
        validate=validation(parts.validated_model, model) if validation is not None else no_validation,
        checkpointer=checkpointer,
        metrics=metrics,
        record={
            "config": to_plain(cfg),
            "data_fingerprints": data_fingerprints(data.fingerprint, tokenizer.fingerprint),
            **({"init": lineage} if lineage else {}),
        },
        stop_signal=stop_signal,
        host_memory=HostMemory(host_memory_trim_every),
        budget=RunBudget(cfg.train, started if started is not None else time.monotonic()),
        end_cost=end_cost(parts.validated_model, model) if end_cost is not None else None,
    )
    if resume_state is not None:
        trainer.load_state(resume_state)
    return FitSetup(machine, data, model, trainer)


def setup_fit(cfg: FitConfig, data: PreparedData | None = None, **build_options: Any) -> FitSetup:
    """`resolve_machine`, `prepare_fit_data` (unless `data` is given) and `build_fit`, in one
    process without torchrun: what benchmark scripts run."""
    machine = resolve_machine(cfg)
    if data is None:
        data = prepare_fit_data(cfg, machine, progress=lambda *_: None)
    return build_fit(cfg, machine, data, **build_options)


def check_eval_lengths(data: PreparedData, cfg: FitConfig) -> None:
    """Refuse, before training, a validation or test pair longer than the model can embed.

    Those splits are never filtered (they are scored as they are), so such a pair would
    otherwise stop the run at its first validation or, worse, after training at the test.
    """
    if cfg.model.positions == Positions.none:  # no position table: any length embeds
        return
    limit = cfg.model.max_positions
    # Every direction a multilingual run trains is validated and tested, so each is checked;
    # a run of one direction keeps the message without a direction's name.
    directions = data.directions or []
    named = len(directions) > 1
    sets = [(d.name, d.valid, d.test) for d in directions] or [(None, data.valid, data.test)]
    for name, valid, test in sets:
        for split, corpus in (("valid", valid), ("test", test)):
            if corpus is None:  # no test split
                continue
            positions = np.maximum(corpus.src_lengths, corpus.tgt_lengths + 1)  # src + eos; [bos] + tgt
            index = int(np.argmax(positions))
            if positions[index] > limit:
                where = f" of {name}" if named else ""
                raise MtrainError(
                    f"data: pair {index + 1} of the {split} split{where} (data.splits.{split}="
                    f"{getattr(cfg.data.splits, split)}) is {int(positions[index])} subword tokens long but the "
                    f"model embeds at most {limit} positions (model.max_positions); shorten or remove that "
                    "line, or raise model.max_positions"
                )
