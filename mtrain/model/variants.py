"""The ablation bench's layer variants, and the layer class a config gets.

A variant keeps the standard layer's sublayers, norms and parameter names (checkpoints,
export and instruments see the same modules) and changes only how they are connected:

- `model.norm_position=post` (Vaswani et al. 2017): Norm(x + Dropout(Sublayer(x))). The
  stream leaves every layer normalised already, so `model.final_norm` defaults to off there.
- `model.residual_input=normalized` (pre-norm only): Norm(x) + Dropout(Sublayer(Norm(x))),
  the residual adds the normalised input.
- `model.decoder_order=cross_self_ffn|self_ffn_cross`: the decoder's sublayers in that order.

The default config (pre-norm, raw residual, self_cross_ffn) gets the standard layers of
`layers.py` unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from torch import Tensor, nn

from mtrain.config import DecoderOrder, ModelConfig, NormPosition, ResidualInput
from mtrain.model.dropout import dropout_add
from mtrain.model.layers import DecoderLayer, EncoderLayer
from mtrain.model.positions import RotaryPositions
from mtrain.model.state import LayerCache

Sublayer = Callable[[Tensor], Tensor]
# (stream x, sublayer, its norm, dropout p, training) -> the stream after the sublayer
Residual = Callable[[Tensor, Sublayer, nn.Module, float, bool], Tensor]


def pre_norm(x: Tensor, sublayer: Sublayer, norm: nn.Module, p: float, training: bool) -> Tensor:
    return dropout_add(x, sublayer(norm(x)), p, training)


def post_norm(x: Tensor, sublayer: Sublayer, norm: nn.Module, p: float, training: bool) -> Tensor:
    normed: Tensor = norm(dropout_add(x, sublayer(x), p, training))
    return normed


def normalized_residual(x: Tensor, sublayer: Sublayer, norm: nn.Module, p: float, training: bool) -> Tensor:
    normalized = norm(x)  # fp32, the stream's dtype: the sublayer casts its own copy
    return dropout_add(normalized, sublayer(normalized), p, training)


def residual_for(cfg: ModelConfig) -> Residual:
    if cfg.norm_position == NormPosition.post:
        return post_norm
    if cfg.residual_input == ResidualInput.normalized:
        return normalized_residual
    return pre_norm


class VariantEncoderLayer(EncoderLayer):
    """The standard encoder layer's sublayers inside another residual connection."""

    def __init__(self, cfg: ModelConfig, rotary: RotaryPositions | None):
        super().__init__(cfg, rotary)
        self.residual = residual_for(cfg)

    def forward(self, x: Tensor, src_bias: Tensor | None) -> Tensor:
        p, training = self.dropout_p, self.training
        x = self.residual(x, partial(self.self_attn, bias=src_bias), self.self_attn_norm, p, training)
        return self.residual(x, self.ffn, self.ffn_norm, p, training)


class VariantDecoderLayer(DecoderLayer):
    """The standard decoder layer's sublayers inside another residual connection, in
    `model.decoder_order`."""

    def __init__(self, cfg: ModelConfig, rotary: RotaryPositions | None):
        super().__init__(cfg, rotary)
        self.residual = residual_for(cfg)
        self.order = DecoderOrder(cfg.decoder_order).sublayers  # e.g. ("cross", "self", "ffn")

    def forward(
        self,
        x: Tensor,
        cross_keys: Tensor,
        cross_values: Tensor,
        src_bias: Tensor | None,
        cache: LayerCache | None = None,
        offset: int = 0,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        weights = None

        def cross_attn(h: Tensor) -> Tensor:
            nonlocal weights
            attended: Tensor
            attended, weights = self.cross_attn(h, cross_keys, cross_values, src_bias, need_weights)
            return attended

        sublayers: dict[str, tuple[Sublayer, nn.Module]] = {
            "self": (partial(self.self_attn, causal=True, cache=cache, offset=offset), self.self_attn_norm),
            "cross": (cross_attn, self.cross_attn_norm),
            "ffn": (self.ffn, self.ffn_norm),
        }
        for name in self.order:
            sublayer, norm = sublayers[name]
            x = self.residual(x, sublayer, norm, self.dropout_p, self.training)
        return x, weights


def _standard_residual(cfg: ModelConfig) -> bool:
    return cfg.norm_position == NormPosition.pre and cfg.residual_input == ResidualInput.raw


def encoder_layer(cfg: ModelConfig, rotary: RotaryPositions | None) -> EncoderLayer:
    """The standard Pre-LN encoder layer, or the variant `cfg` asks for."""
    if _standard_residual(cfg):
        return EncoderLayer(cfg, rotary)
    return VariantEncoderLayer(cfg, rotary)


def decoder_layer(cfg: ModelConfig, rotary: RotaryPositions | None) -> DecoderLayer:
    """The standard Pre-LN decoder layer, or the variant `cfg` asks for."""
    if _standard_residual(cfg) and cfg.decoder_order == DecoderOrder.self_cross_ffn:
        return DecoderLayer(cfg, rotary)
    return VariantDecoderLayer(cfg, rotary)
