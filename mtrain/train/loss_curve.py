"""The training loss curve: a point every `train.loss_every` updates, the mean over exactly those.

The training lines of `mtrain.train.metric_log` come every `train.log_every` updates and every
`train.log_every_time` of training, so the updates each line averages depend on how fast the
machine ran. The curve's do not: with loss_every=50 the point at update 100 is the loss per
target token over updates 51-100, whatever the load, so two runs of the same seed log the same
points and the curves of runs compare point for point (TensorBoard's train/loss, read by
`mtrain report`). The sums stay device tensors until `read`, which the logger calls where it
reads the device anyway: the curve adds no host synchronisation to the updates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class LossPoint:
    """The mean losses per target token over updates `first_update`..`update` (both included)."""

    update: int
    first_update: int
    loss: float
    nll_loss: float


class LossCurve:
    """Sums the losses of each run of `every` updates and closes a point at every multiple of it.

    A checkpoint holds the open point's sums (`open_point`), so a resumed run closes it as the
    run would have without the break; a run that starts between two multiples (a changed
    loss_every, a checkpoint of an older mtrain) has a shorter first point, which says where it
    starts (`LossPoint.first_update`)."""

    def __init__(self, every: int) -> None:
        self.every = every
        self._pending: list[tuple[int, int, Any, Any, Any]] = []  # closed, not read yet
        self._first_update: int | None = None
        self._loss_sum: Any = 0.0
        self._nll_sum: Any = 0.0
        self._tokens: Any = 0  # target tokens of updates whose step was not skipped

    def add(self, stats: dict[str, Any], update: int) -> None:
        """Update `update`'s statistics (device tensors, not read here)."""
        if self._first_update is None:
            self._first_update = update
        self._loss_sum = self._loss_sum + stats["loss_sum"]
        self._nll_sum = self._nll_sum + stats["nll_sum"]
        tokens = stats["tgt_tokens"]
        if "skipped" in stats:  # a non-finite update's sums are 0: its tokens count for nothing
            tokens = tokens * (1 - stats["skipped"].to(torch.int64))
        self._tokens = self._tokens + tokens
        if update % self.every == 0:
            self._pending.append((self._first_update, update, self._loss_sum, self._nll_sum, self._tokens))
            self._first_update, self._loss_sum, self._nll_sum, self._tokens = None, 0.0, 0.0, 0

    def open_point(self) -> dict[str, Any] | None:
        """The sums of the point not closed yet, read on the host (for a checkpoint, which
        synchronises anyway); None when no update has been added since the last point."""
        if self._first_update is None:
            return None
        return {
            "first_update": self._first_update,
            "loss_sum": float(self._loss_sum),
            "nll_sum": float(self._nll_sum),
            "tokens": int(self._tokens),
        }

    def restore(self, point: dict[str, Any] | None) -> None:
        """Continue the open point of a checkpoint (`open_point`'s; None: none). The float32 sums
        add up from the same values as they would have unbroken: the point comes out the same."""
        if point is None:
            return
        self._first_update = int(point["first_update"])
        self._loss_sum, self._nll_sum = float(point["loss_sum"]), float(point["nll_sum"])
        self._tokens = int(point["tokens"])

    def read(self) -> list[LossPoint]:
        """The points closed since the last call, read on the host. A run of updates that were
        all skipped as non-finite has no loss, and no point (the skips are logged on their own)."""
        points = []
        for first_update, update, loss_sum, nll_sum, tokens in self._pending:
            count = int(tokens)
            if count:
                points.append(LossPoint(update, first_update, float(loss_sum) / count, float(nll_sum) / count))
        self._pending.clear()
        return points
