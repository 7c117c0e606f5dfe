"""What a training checkpoint holds, and how a trainer continues from one.

A checkpoint is a plain dict (tensors and Python scalars, so it loads with
`torch.load(weights_only=True)`): the model, with `train.ema_decay` the weights' average
(`ema`, what decoding uses: `decode_weights`), the optimiser (in `last.pt` only) and loss-scaler states, every
random generator's state, the `TrainState` (data position, clock, best and patience), the
resolved config and whatever the caller adds (the data fingerprints that a resume checks).
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Any

import torch
from omegaconf import OmegaConf

from mtrain.config import TrainConfig, to_typed
from mtrain.train.budget import resumed_training_budget
from mtrain.train.ema import WeightAverage
from mtrain.train.progress import TrainState
from mtrain.train.random_state import rng_state, set_rng_state
from mtrain.train.schedule import learning_rate_change

log = logging.getLogger("mtrain")


def capture(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    state: TrainState,
    record: dict[str, Any],
    ema: WeightAverage | None = None,
) -> dict[str, Any]:
    """The checkpoint of a trainer at `state`; `record` holds the config and the fingerprints."""
    from mtrain import __version__

    averaged = {} if ema is None else {"ema": ema.state_dict(), "ema_decay": ema.decay, "decode_weights": "ema"}
    return {
        "model": model.state_dict(),
        **averaged,
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict(),
        "rng": rng_state(),
        "trainer": asdict(state),
        "update": state.update,
        "mtrain_version": __version__,
        **record,
    }


def without_optimizer(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """What `best.pt` and `update_N.pt` hold: the checkpoint less the optimiser's state.

    Adam's two moments per parameter are 2/3 of a full checkpoint, and only a resume reads
    them; `last.pt` keeps them (`mtrain.train.checkpointer`). The rest (weights, data
    position, clock, random state, config) is small and lets such a checkpoint warm-start."""
    return {key: value for key, value in checkpoint.items() if key != "optimizer"}


def has_optimizer_state(checkpoint: dict[str, Any]) -> bool:
    return "optimizer" in checkpoint


def restore(
    checkpoint: dict[str, Any],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    ema: WeightAverage | None = None,
) -> TrainState:
    """Load a checkpoint's tensors and random state into the parts; returns its TrainState.
    (`mtrain.train.checkpointer.check_resumable_*` have checked that it fits first.)
    A checkpoint without the optimiser's state (`without_optimizer`) leaves the optimiser
    fresh: Adam's moments start again from zero, so that resume is not exact. One without an
    average, resumed with train.ema_decay, starts the average from its weights."""
    model.load_state_dict(checkpoint["model"])
    if ema is not None and "ema" in checkpoint:
        ema.load_state_dict(checkpoint["ema"])
    elif ema is not None:
        ema.reset_to(model)
        log.warning(
            "the checkpoint of update %s holds no average of the weights (trained without "
            "train.ema_decay): the average starts from its weights",
            checkpoint.get("update"),
        )
    if has_optimizer_state(checkpoint):
        optimizer.load_state_dict(checkpoint["optimizer"])
    scaler.load_state_dict(checkpoint["scaler"])
    set_rng_state(checkpoint["rng"])
    return TrainState(**checkpoint["trainer"])


def saved_train_config(checkpoint: dict[str, Any]) -> TrainConfig | None:
    """The train.* settings `checkpoint` was written under (None if they no longer read)."""
    try:
        typed: TrainConfig = to_typed(OmegaConf.merge(OmegaConf.structured(TrainConfig), checkpoint["config"]["train"]))
        return typed
    except Exception:
        return None


def resumed_budget(checkpoint: dict[str, Any], train_cfg: TrainConfig, state: TrainState) -> float | None:
    """The training time a run resumed from `checkpoint` (restored at `state`) plans for under
    `train_cfg` (mtrain.train.budget.resumed_training_budget)."""
    return resumed_training_budget(saved_train_config(checkpoint), train_cfg, state.train_budget_seconds)


def warn_of_an_inexact_resume(
    checkpoint: dict[str, Any], train_cfg: TrainConfig, state: TrainState, saved_budget: float | None = None
) -> None:
    """Say what makes continuing from `checkpoint` (restored at `state`, with the training time
    it planned, `saved_budget`) differ from the run it came from: no optimiser state (a warm
    start), or train.* settings (a larger max_time, ...) that move the learning rate of the
    next update."""
    if not has_optimizer_state(checkpoint):
        log.warning(
            "the checkpoint of update %d holds the weights only (no optimiser state): training goes "
            "on from its weights, data position and clock with Adam's moments started afresh, which "
            "is not an exact resume (last.pt resumes exactly)",
            state.update,
        )
    saved = saved_train_config(checkpoint)
    if saved is None:
        return
    change = learning_rate_change(
        saved, train_cfg, state.update + 1, state.train_seconds, saved_budget, state.train_budget_seconds
    )
    if change is not None:
        log.warning(
            "the learning rate of update %d is %.1e under the current train.* settings (%s) where the "
            "checkpoint's (%s) give %.1e: the schedule is a function of the update and of the share of "
            "the training time spent, so another budget moves the run along its curve (docs/TRAINING.md)",
            state.update + 1,
            change[1],
            _schedule_settings(train_cfg),
            _schedule_settings(saved),
            change[0],
        )


def _schedule_settings(cfg: TrainConfig) -> str:
    settings = f"scheduler={cfg.scheduler}, max_updates={cfg.max_updates}, max_time={cfg.max_time}"
    return settings + (f", max_train_time={cfg.max_train_time}" if cfg.max_train_time is not None else "")
