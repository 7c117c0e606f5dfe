"""An exponential moving average of the weights (`train.ema_decay`), kept beside training.

After update n the average moves towards the weights: ema <- ema + (1 - d_n) (w - ema), with
d_n = min(decay, (1 + k) / (10 + k)) and k = n - ema_start_update the updates averaged so
far (TensorFlow's `ExponentialMovingAverage(num_updates=)` warm-up). Without the warm-up a
short run's average would keep the random initial weights: decay 0.999 leaves them 8% of it
after the ~2,500 updates of the 20-minute CPU preset; with it they weigh 10% after the first
update (d = 0.1) and under 1e-6 after the tenth. Before `ema_start_update` the average is a copy of the weights.

The average is a second copy of the model on the training device, in the weights' dtype
(fp32 master weights), updated by one `torch._foreach_lerp_` per update on a GPU (a loop of
`lerp_` on a CPU, where it is faster): no host synchronisation. Every rank of a DDP job holds the same
weights after each step, so every rank's average is the same. Validation, best.pt and the
test decode use `module` (the averaged model); checkpoints store it beside the trained
weights (`ema`), and decoding picks it unless told `weights=raw` (`mtrain.checkpoint.files.load_run`).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from mtrain.model import Seq2SeqTransformer


class WeightAverage:
    """The moving average of `model`'s parameters; `module` decodes and validates with it."""

    def __init__(self, model: Seq2SeqTransformer, decay: float, start_update: int = 0) -> None:
        self.decay = decay
        self.start_update = start_update
        # A copy that shares nothing with the model; its buffers (position tables, the output
        # vocabulary's mask) never change in training, so they are copied once.
        self.module = copy.deepcopy(model).eval()
        for parameter in self.module.parameters():
            parameter.requires_grad_(False)
        self._averaged: list[torch.Tensor] = [p.detach() for p in self.module.parameters()]
        self._weights: list[torch.Tensor] = [p.detach() for p in model.parameters()]

    def decay_at(self, update: int) -> float:
        """d_n of update `update` (1-based); 0 before ema_start_update (a copy)."""
        averaged_so_far = update - 1 - self.start_update
        if averaged_so_far < 0:
            return 0.0
        return min(self.decay, (1.0 + averaged_so_far) / (10.0 + averaged_so_far))

    @torch.no_grad()
    def update(self, update: int) -> None:
        """Fold in the weights after update number `update`."""
        weight = 1.0 - self.decay_at(update)
        if self._averaged and self._averaged[0].is_cuda:  # one kernel launch for all the tensors
            torch._foreach_lerp_(self._averaged, self._weights, weight)
        else:  # on a CPU the foreach form ran 4.5x slower than a loop (torch 2.13; docs/PERFORMANCE.md)
            for averaged, weights in zip(self._averaged, self._weights, strict=True):
                averaged.lerp_(weights, weight)

    def state_dict(self) -> dict[str, Any]:
        return self.module.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state)

    def reset_to(self, model: nn.Module) -> None:
        """Start the average again from `model`'s weights (a resume from a checkpoint without one)."""
        self.module.load_state_dict(model.state_dict())
