"""Learning-rate schedules and time budgets.

The schedule is a pure function of (update, progress) so resuming needs no scheduler
state beyond the update count: the same update always gets the same learning rate.

Under a time budget, progress is the training time spent over the training budget: all of
`train.max_train_time`, or the share of `train.max_time` (the whole run's wall time) that is
left for training once preparation and the last validation and test decode are set aside
(`mtrain.train.budget`; the trainer keeps the planned share in its state and saves it). Raising
max_time when resuming (a finished 2-minute run given 3m) therefore moves the run back on its
curve: the minute added goes to training, the warmup share and the decay are stretched to the
longer training time, and the learning rate jumps up (linear decay, 9% warmup, 80 s of training
planned, grown to 140 s: from 8e-06 to about 7.1e-04). The trainer warns with both values when
a resume changes the learning rate (`learning_rate_change`).
"""

from __future__ import annotations

import math

from mtrain.config import Scheduler, TrainConfig
from mtrain.durations import parse_budget_share, parse_duration


def has_time_budget(cfg: TrainConfig) -> bool:
    return cfg.max_time is not None or cfg.max_train_time is not None


def warmup_share(cfg: TrainConfig, budget_seconds: float | None = None) -> float | None:
    """The share of the training time spent warming up, or None to warm up by updates.

    `train.warmup_time` is "N%" of the training time or a duration ("60s", "2m"), a share of
    `budget_seconds` (the planned training time; by default the configured one). It applies only
    to a time-budgeted run: without one there is no training time to take a share of, and
    `train.warmup_updates` is used (so `train.max_time=null train.max_updates=N` still warms up
    as before).
    """
    if not has_time_budget(cfg) or cfg.warmup_time is None or str(cfg.warmup_time).strip() == "":
        return None
    if budget_seconds is None:
        budget_seconds = _configured_budget(cfg)
    share = parse_budget_share(cfg.warmup_time, budget_seconds, "train.warmup_time")
    return None if share is None else min(share, 0.99)  # range checked by config_checks


def _configured_budget(cfg: TrainConfig) -> float | None:
    max_train = parse_duration(cfg.max_train_time, "train.max_train_time")
    return max_train if max_train is not None else parse_duration(cfg.max_time)


class LearningRateSchedule:
    """Linear warmup to `lr`, then inverse-sqrt, cosine, linear decay or constant.

    Cosine and linear decay need a horizon: `decay_updates`, or else the fraction of the
    time budget used (`progress`, 0..1), so a 20-minute run decays to min_lr at 20 minutes.

    Warmup is counted in updates (`warmup_updates`) or, with `warmup_time` and a time
    budget, in the share of the budget used: then the peak comes at the same point of the
    run on a slow machine as on a fast one, and time-driven decay starts from `lr` at the end
    of the warmup (the peak is exactly `lr`).
    """

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg  # checked by mtrain.config_checks (cosine and linear have a horizon)
        self.horizon = cfg.decay_updates or (None if has_time_budget(cfg) else cfg.max_updates)
        self.warmup_share = warmup_share(cfg)  # of the configured training time

    def lr(self, update: int, progress: float = 0.0, budget_seconds: float | None = None) -> float:
        """Learning rate for update number `update` (1-based); progress = used share of the
        training time, `budget_seconds` (by default the configured one: what a warmup given as a
        duration is a share of).

        Warmup and decay are combined with a min(), so the curve is continuous even when
        the decay is driven by time and the warmup by updates.
        """
        share = self.warmup_share if budget_seconds is None else warmup_share(self.cfg, budget_seconds)
        if share is not None:
            return self._lr_by_time(update, progress, share)
        cfg = self.cfg
        warmup_ramp = update / cfg.warmup_updates if cfg.warmup_updates > 0 else 1.0
        if cfg.scheduler == Scheduler.constant:
            return cfg.lr * min(1.0, warmup_ramp)
        if cfg.scheduler == Scheduler.inverse_sqrt:
            return cfg.lr * min(warmup_ramp, math.sqrt(max(cfg.warmup_updates, 1) / max(update, 1)))
        fraction = update / self.horizon if self.horizon is not None else progress
        return min(cfg.lr * warmup_ramp, self._decayed(fraction))

    def _lr_by_time(self, update: int, progress: float, share: float) -> float:
        """Warmup over the first `share` of the budget; decay (by time, or by updates when
        `decay_updates` is set) from there. inverse_sqrt decays as sqrt(share / progress)."""
        cfg = self.cfg
        if progress < share:
            return cfg.lr * progress / share
        if cfg.scheduler == Scheduler.constant:
            return cfg.lr
        if cfg.scheduler == Scheduler.inverse_sqrt:
            return cfg.lr * math.sqrt(share / progress) if share > 0 else cfg.lr
        if self.horizon is not None:
            return self._decayed(update / self.horizon)
        return self._decayed((progress - share) / (1.0 - share))

    def _decayed(self, fraction: float) -> float:
        """Cosine or linear decay from lr (fraction 0) to min_lr (fraction 1)."""
        cfg = self.cfg
        fraction = min(1.0, max(0.0, fraction))
        if cfg.scheduler == Scheduler.linear:
            decay = 1.0 - fraction
        else:
            decay = 0.5 * (1.0 + math.cos(math.pi * fraction))
        return cfg.min_lr + (cfg.lr - cfg.min_lr) * decay


def lr_at(cfg: TrainConfig, update: int, train_seconds: float, budget_seconds: float | None = None) -> float:
    """The learning rate `cfg` gives update `update` after `train_seconds` of training, of a
    training budget of `budget_seconds` (by default the configured one)."""
    if budget_seconds is None:
        budget_seconds = _configured_budget(cfg)
    progress = train_seconds / budget_seconds if budget_seconds else 0.0
    return LearningRateSchedule(cfg).lr(update, progress, budget_seconds)


def learning_rate_change(
    saved: TrainConfig,
    current: TrainConfig,
    update: int,
    train_seconds: float,
    saved_budget: float | None = None,
    current_budget: float | None = None,
) -> tuple[float, float] | None:
    """(saved lr, current lr) of update `update` when the checkpoint's training settings and
    budget and the current ones give it learning rates more than 1% apart (a resume with another
    budget or schedule); None when they agree."""
    before = lr_at(saved, update, train_seconds, saved_budget)
    after = lr_at(current, update, train_seconds, current_budget)
    if abs(after - before) <= 0.01 * max(abs(before), abs(after)):
        return None
    return before, after
