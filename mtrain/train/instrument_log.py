"""Training instruments (`train.instruments`): per-group gradient norms and activation
statistics of one update every `train.instrument_every`, to TensorBoard (ablation bench)."""

from __future__ import annotations

import torch

from mtrain.model import Seq2SeqTransformer, StatisticsRecorder
from mtrain.train.metric_log import MetricLogger


class InstrumentLog:
    """`arm(update)` before an update's forward; `record(update)` after its backward."""

    def __init__(self, model: Seq2SeqTransformer, enabled: bool, every: int, metrics: MetricLogger | None) -> None:
        self.model = model
        self.enabled = enabled
        self.every = every
        self.metrics = metrics
        self.armed = False
        self._statistics = StatisticsRecorder(model)

    def arm(self, update: int) -> None:
        """Record the activations of update `update` if it is one to instrument."""
        self.armed = self.enabled and update % self.every == 0
        if self.armed:
            self._statistics.arm()

    def record(self, update: int) -> None:
        """Log the gradient norms (after unscaling, before clipping) and the activation statistics."""
        if not self.armed:
            return
        values: dict[str, float | None] = {}
        for name, parameters in self.model.gradient_norm_groups().items():
            grads = [p.grad for p in parameters if p.grad is not None]
            values[f"grad_norm/{name}"] = (
                float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
                if grads
                else 0.0
            )
        for name, value in self._statistics.statistics.items():
            values[f"activations/{name}"] = value
        self._statistics.disarm()
        self.armed = False
        if self.metrics is not None:
            self.metrics.scalars("instruments", values, update)
