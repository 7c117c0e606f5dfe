"""Activation statistics for the ablation bench, recorded only when the trainer asks.

`Seq2SeqTransformer.collect_statistics()` arms a `StatisticsRecorder`: it puts forward hooks
on every sublayer and layer and asks attention modules for their weights, records one
forward pass into `model.statistics` (name -> float) and removes everything again. Normal
steps run with no hook and no extra work.

Means and standard deviations are over every element of the activation, padded positions
included; entropies are means over batch, heads and query positions.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from mtrain.model.attention import CrossAttention, SelfAttention
from mtrain.model.feedforward import FeedForward
from mtrain.model.layers import DecoderLayer, EncoderLayer


def _first(output: Any) -> Tensor:
    return output[0] if isinstance(output, tuple) else output


@torch.no_grad()
def _moments(x: Tensor) -> tuple[float, float]:
    x = x.detach().float()
    return x.mean().item(), x.std().item()


def _record_sublayer_input(stats: dict[str, float], name: str, module: nn.Module, args: tuple) -> None:
    stats[f"{name}.input_mean"], stats[f"{name}.input_std"] = _moments(args[0])


def _record_sublayer_output(stats: dict[str, float], name: str, module: nn.Module, args: tuple, output: Any) -> None:
    stats[f"{name}.output_std"] = _moments(_first(output))[1]
    if getattr(module, "entropy", None) is not None:
        stats[f"{name}.entropy"] = module.entropy


def _record_residual(stats: dict[str, float], name: str, module: nn.Module, args: tuple, output: Any) -> None:
    stats[f"{name}.residual_mean"], stats[f"{name}.residual_std"] = _moments(_first(output))


class StatisticsRecorder:
    """Hooks that fill `model.statistics` during one forward pass of `model`."""

    def __init__(self, model: nn.Module):
        self._model = model
        self._handles: list[RemovableHandle] = []

    @property
    def armed(self) -> bool:
        return bool(self._handles)

    def arm(self) -> None:
        self.disarm()
        stats: dict[str, float] = self._model.statistics
        stats.clear()
        for name, module in self._model.named_modules():
            if isinstance(module, (SelfAttention, CrossAttention, FeedForward)):
                self._handles.append(module.register_forward_pre_hook(partial(_record_sublayer_input, stats, name)))
                self._handles.append(module.register_forward_hook(partial(_record_sublayer_output, stats, name)))
                if not isinstance(module, FeedForward):
                    module.record_entropy = True
                    module.entropy = None
            elif isinstance(module, (EncoderLayer, DecoderLayer)):
                self._handles.append(module.register_forward_hook(partial(_record_residual, stats, name)))
        self._handles.append(self._model.register_forward_hook(lambda *_: self.disarm()))

    def disarm(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for module in self._model.modules():
            if isinstance(module, (SelfAttention, CrossAttention)):
                module.record_entropy = False
