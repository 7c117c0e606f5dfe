"""Learning-rate schedules and time budgets.

The schedule is a pure function of (update, progress) so resuming needs no scheduler
state beyond the update count: the same update always gets the same learning rate.

Under a time budget, progress is the training time spent over `train.max_time`. Raising
max_time when resuming (a finished 2-minute run given 3m) therefore moves the run back on
its curve, to where a run planned for the new budget would be (2/3 of the way): the warmup
share and the decay are stretched to the new budget and the learning rate jumps up (linear
decay, 9% warmup: 8e-06 at the end of the 2 minutes, 5.5e-04 for the next update). The
trainer warns with both values when a resume changes the learning rate
(`learning_rate_change`).
"""

from __future__ import annotations

import math

from mtrain.config import Scheduler, TrainConfig
from mtrain.durations import parse_budget_share, parse_duration


def warmup_share(cfg: TrainConfig) -> float | None:
    """The share of the time budget spent warming up, or None to warm up by updates.

    `train.warmup_time` is "N%" of `train.max_time` or a duration ("60s", "2m"). It applies
    only to a time-budgeted run: without `train.max_time` there is no budget to take a share
    of, and `train.warmup_updates` is used (so `train.max_time=null train.max_updates=N`
    still warms up as before).
    """
    return parse_budget_share(cfg.warmup_time, cfg.max_time, "train.warmup_time")  # range: config_checks


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
        self.horizon = cfg.decay_updates or (cfg.max_updates if cfg.max_time is None else None)
        self.warmup_share = warmup_share(cfg)

    def lr(self, update: int, progress: float = 0.0) -> float:
        """Learning rate for update number `update` (1-based); progress = used share of max_time.

        Warmup and decay are combined with a min(), so the curve is continuous even when
        the decay is driven by time and the warmup by updates.
        """
        if self.warmup_share is not None:
            return self._lr_by_time(update, progress, self.warmup_share)
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


def lr_at(cfg: TrainConfig, update: int, train_seconds: float) -> float:
    """The learning rate `cfg` gives update `update` after `train_seconds` of training."""
    max_seconds = parse_duration(cfg.max_time)
    return LearningRateSchedule(cfg).lr(update, train_seconds / max_seconds if max_seconds else 0.0)


def learning_rate_change(
    saved: TrainConfig, current: TrainConfig, update: int, train_seconds: float
) -> tuple[float, float] | None:
    """(saved lr, current lr) of update `update` when the checkpoint's training settings and
    the current ones give it learning rates more than 1% apart (a resume with another budget
    or schedule); None when they agree."""
    before, after = lr_at(saved, update, train_seconds), lr_at(current, update, train_seconds)
    if abs(after - before) <= 0.01 * max(abs(before), abs(after)):
        return None
    return before, after
