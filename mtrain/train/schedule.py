"""Learning-rate schedules and time budgets.

The schedule is a pure function of (update, progress) so resuming needs no scheduler
state beyond the update count: the same update always gets the same learning rate.
"""

from __future__ import annotations

import math
import re
from typing import Optional

from mtrain.config import TrainConfig
from mtrain.errors import MtrainError

SCHEDULERS = ("inverse_sqrt", "cosine", "linear", "constant")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


def parse_duration(text: Optional[str], key: str = "train.max_time") -> Optional[float]:
    """'90s', '20m', '2h', '1.5h' or a bare number of seconds -> seconds."""
    if text is None or str(text).strip() == "":
        return None
    match = _DURATION.match(str(text))
    if not match:
        raise MtrainError(f"{key}={text!r}: not a duration; write e.g. 90s, 20m or 2h")
    return float(match.group(1)) * _SECONDS[match.group(2)]


class LearningRateSchedule:
    """Linear warmup to `lr`, then inverse-sqrt, cosine, linear decay or constant.

    Cosine and linear decay need a horizon: `decay_updates`, or else the fraction of the
    time budget used (`progress`, 0..1), so a 20-minute run decays to min_lr at 20 minutes.
    """

    def __init__(self, cfg: TrainConfig) -> None:
        if cfg.scheduler not in SCHEDULERS:
            raise MtrainError(f"train.scheduler={cfg.scheduler!r}: choose one of {'|'.join(SCHEDULERS)}")
        if cfg.scheduler in ("cosine", "linear") and cfg.decay_updates is None and cfg.max_time is None:
            if cfg.max_updates is None:
                raise MtrainError(
                    f"train.scheduler={cfg.scheduler} needs a horizon: set train.decay_updates, "
                    "train.max_updates or train.max_time"
                )
        self.cfg = cfg
        self.horizon = cfg.decay_updates or (cfg.max_updates if cfg.max_time is None else None)

    def lr(self, update: int, progress: float = 0.0) -> float:
        """Learning rate for update number `update` (1-based); progress = used share of max_time.

        Warmup and decay are combined with a min(), so the curve is continuous even when
        the decay is driven by time and the warmup by updates.
        """
        cfg = self.cfg
        warmup_ramp = update / cfg.warmup_updates if cfg.warmup_updates > 0 else 1.0
        if cfg.scheduler == "constant":
            return cfg.lr * min(1.0, warmup_ramp)
        if cfg.scheduler == "inverse_sqrt":
            return cfg.lr * min(warmup_ramp, math.sqrt(max(cfg.warmup_updates, 1) / max(update, 1)))
        fraction = update / self.horizon if self.horizon is not None else progress
        fraction = min(1.0, max(0.0, fraction))
        if cfg.scheduler == "linear":
            decay = 1.0 - fraction
        else:
            decay = 0.5 * (1.0 + math.cos(math.pi * fraction))
        return min(cfg.lr * warmup_ramp, cfg.min_lr + (cfg.lr - cfg.min_lr) * decay)
