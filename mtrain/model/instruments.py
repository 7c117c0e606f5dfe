"""Activation statistics for the ablation bench, recorded by forward hooks only when asked.

A `StatisticsRecorder` is attached to a model from outside: `arm()` puts forward hooks on
every sublayer, attention kernel and layer, the next forward pass fills `statistics`
(name -> float), and the hooks remove themselves after it (or on `disarm()`). The model's
modules hold no instrument state, and normal steps run with no hook and no extra work.

Names: `{encoder|decoder}.{i}.{self_attn|cross_attn|ffn}.{input_mean|input_std|output_std}`,
`{encoder|decoder}.{i}.{self_attn|cross_attn}.entropy` (mean nats per query) and
`{encoder|decoder}.{i}.{residual_mean|residual_std}` (the stream after layer i).
Means and standard deviations are over every element of the activation, padded positions
included; entropies are means over batch, heads and query positions. A sublayer's input is
recorded as the sublayer receives it, before its cast to autocast's dtype.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from mtrain.model.attention import CrossAttention, DotProductAttention, SelfAttention, attention_probabilities
from mtrain.model.feedforward import FeedForward
from mtrain.model.layers import DecoderLayer, EncoderLayer


def _first(output: Any) -> Tensor:
    first: Tensor = output[0] if isinstance(output, tuple) else output
    return first


@torch.no_grad()
def _moments(x: Tensor) -> tuple[float, float]:
    x = x.detach().float()
    return x.mean().item(), x.std().item()


def _record_sublayer_input(stats: dict[str, float], name: str, module: nn.Module, args: tuple[Any, ...]) -> None:
    stats[f"{name}.input_mean"], stats[f"{name}.input_std"] = _moments(args[0])


def _record_sublayer_output(
    stats: dict[str, float], name: str, module: nn.Module, args: tuple[Any, ...], output: Any
) -> None:
    stats[f"{name}.output_std"] = _moments(_first(output))[1]


@torch.no_grad()
def _record_entropy(stats: dict[str, float], name: str, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
    """Entropy of the attention probabilities (before dropout), recomputed from the kernel's
    positional arguments (q, k, v, bias, causal, ...): the fused sdpa kernel never returns them."""
    q, k, _, bias, causal = args[:5]
    weights = attention_probabilities(q, k, bias, causal)
    stats[f"{name}.entropy"] = torch.special.entr(weights).sum(-1).mean().item()


def _record_residual(stats: dict[str, float], name: str, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
    stats[f"{name}.residual_mean"], stats[f"{name}.residual_std"] = _moments(_first(output))


class StatisticsRecorder:
    """Hooks that fill `statistics` during the next forward pass of `model`."""

    def __init__(self, model: nn.Module):
        self._model = model
        self._handles: list[RemovableHandle] = []
        self.statistics: dict[str, float] = {}

    @property
    def armed(self) -> bool:
        return bool(self._handles)

    def arm(self) -> None:
        """Record the next forward pass (clearing `statistics`), then stop."""
        self.disarm()
        stats: dict[str, float] = {}  # filled by the hooks below
        self.statistics = stats
        for name, module in self._model.named_modules():
            if isinstance(module, (SelfAttention, CrossAttention, FeedForward)):
                self._handles.append(module.register_forward_pre_hook(partial(_record_sublayer_input, stats, name)))
                self._handles.append(module.register_forward_hook(partial(_record_sublayer_output, stats, name)))
            elif isinstance(module, DotProductAttention):
                sublayer = name.rpartition(".")[0]  # e.g. decoder.0.cross_attn
                self._handles.append(module.register_forward_hook(partial(_record_entropy, stats, sublayer)))
            elif isinstance(module, (EncoderLayer, DecoderLayer)):
                self._handles.append(module.register_forward_hook(partial(_record_residual, stats, name)))
        self._handles.append(self._model.register_forward_hook(lambda *_: self.disarm()))

    def disarm(self) -> None:
        """Remove every hook; `statistics` keeps what was recorded."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
