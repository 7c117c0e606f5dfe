"""Encoder and decoder layers, and the residual connection around each of their sublayers.

Pre-norm (the default; Xiong et al. 2020): x + Dropout(Sublayer(Norm(x))) -- the residual
adds the *un-normalised* x, so the stream is never normalised inside the stack and the
final norm of each stack (`model.final_norm`) does that once at the end.
Post-norm (Vaswani et al. 2017): Norm(x + Dropout(Sublayer(x))). Its stream leaves every
layer normalised already, so `model.final_norm` defaults to off there (null = auto).

`model.residual_input=normalized` (pre-norm only, an ablation) makes the residual add the
normalised input instead: Norm(x) + Dropout(Sublayer(Norm(x))).

Every sublayer has its own norm (2 per encoder layer, 3 per decoder layer), unless
`model.shared_norm`, where one norm module serves all sublayers of a layer.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mtrain.config import ModelConfig
from mtrain.model.attention import CrossAttention, SelfAttention
from mtrain.model.dropout import dropout_add
from mtrain.model.feedforward import FeedForward
from mtrain.model.positions import RotaryPositions
from mtrain.model.state import LayerCache


def make_norm(norm_type: str, d_model: int) -> nn.Module:
    if norm_type == "rmsnorm":
        return nn.RMSNorm(d_model, eps=1e-6)
    return nn.LayerNorm(d_model)


def _norms(cfg: ModelConfig, count: int) -> list[nn.Module]:
    if cfg.shared_norm:
        return [make_norm(cfg.norm_type, cfg.d_model)] * count
    return [make_norm(cfg.norm_type, cfg.d_model) for _ in range(count)]


def to_compute_dtype(x: Tensor) -> Tensor:
    """x in autocast's dtype when autocast is on, else x.

    Autocast casts the input of every Linear separately, and never caches activation
    casts: without this, a sublayer input feeding W_Q, W_K and W_V would be cast three
    times (and its gradient cast back three times). The residual stream itself stays fp32.
    """
    device = x.device.type
    if torch.is_autocast_enabled(device):
        return x.to(torch.get_autocast_dtype(device))
    return x


class _Residual:
    """Where the norm goes around a sublayer, and the dropout on the sublayer's output."""

    def __init__(self, cfg: ModelConfig):
        self.pre_norm = cfg.norm_position == "pre"
        self.normalized_residual = self.pre_norm and cfg.residual_input == "normalized"
        self.dropout_p = cfg.dropout

    def sublayer_input(self, x: Tensor, norm: nn.Module) -> Tensor:
        return to_compute_dtype(norm(x) if self.pre_norm else x)

    def add(self, x: Tensor, sublayer_output: Tensor, norm: nn.Module, training: bool) -> Tensor:
        # The ablation recomputes Norm(x) in fp32 (the stream's dtype) rather than reuse the
        # sublayer's low-precision input: only the residual's content changes, not its precision.
        base = norm(x) if self.normalized_residual else x
        x = dropout_add(base, sublayer_output, self.dropout_p, training)
        return x if self.pre_norm else norm(x)


class EncoderLayer(nn.Module):
    """Self-attention, then feed-forward, each inside a residual connection."""

    def __init__(self, cfg: ModelConfig, rotary: RotaryPositions | None):
        super().__init__()
        self.residual = _Residual(cfg)
        self.self_attn_norm, self.ffn_norm = _norms(cfg, 2)
        self.self_attn = SelfAttention(cfg.d_model, cfg.heads, cfg.attention_dropout, cfg.attention_impl, rotary)
        self.ffn = FeedForward(cfg.d_model, cfg.ffn_dim, cfg.activation, cfg.activation_dropout)

    def forward(self, x: Tensor, src_bias: Tensor) -> Tensor:
        """x (batch, src_len, d_model); src_bias (batch, 1, 1, src_len) masks padding."""
        residual, training = self.residual, self.training
        h = self.self_attn(residual.sublayer_input(x, self.self_attn_norm), bias=src_bias)
        x = residual.add(x, h, self.self_attn_norm, training)
        h = self.ffn(residual.sublayer_input(x, self.ffn_norm))
        return residual.add(x, h, self.ffn_norm, training)


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention and feed-forward, in `model.decoder_order`."""

    def __init__(self, cfg: ModelConfig, rotary: RotaryPositions | None):
        super().__init__()
        self.order = cfg.decoder_order.split("_")  # e.g. ["self", "cross", "ffn"]
        self.residual = _Residual(cfg)
        self.self_attn_norm, self.cross_attn_norm, self.ffn_norm = _norms(cfg, 3)
        self.self_attn = SelfAttention(cfg.d_model, cfg.heads, cfg.attention_dropout, cfg.attention_impl, rotary)
        self.cross_attn = CrossAttention(
            cfg.d_model, cfg.heads, cfg.attention_dropout, cfg.attention_impl,
            q_proj=cfg.cross_q_proj, k_proj=cfg.cross_k_proj, v_proj=cfg.cross_v_proj,
        )
        self.ffn = FeedForward(cfg.d_model, cfg.ffn_dim, cfg.activation, cfg.activation_dropout)

    def forward(self, x: Tensor, cross_keys: Tensor, cross_values: Tensor, src_bias: Tensor,
                cache: LayerCache | None = None, offset: int = 0,
                need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """x (batch, tgt_len, d_model) -> same shape, and the cross-attention weights
        (batch, tgt_len, src_len) averaged over heads when `need_weights`.

        cross_keys/values come from `self.cross_attn.project_memory`. With a `cache`, x is the
        single position `offset` of incremental decoding.
        """
        residual, training = self.residual, self.training
        weights = None
        for sublayer in self.order:
            if sublayer == "self":
                h = residual.sublayer_input(x, self.self_attn_norm)
                h = self.self_attn(h, causal=True, cache=cache, offset=offset)
                x = residual.add(x, h, self.self_attn_norm, training)
            elif sublayer == "cross":
                h = residual.sublayer_input(x, self.cross_attn_norm)
                h, weights = self.cross_attn(h, cross_keys, cross_values, src_bias, need_weights)
                x = residual.add(x, h, self.cross_attn_norm, training)
            else:
                h = self.ffn(residual.sublayer_input(x, self.ffn_norm))
                x = residual.add(x, h, self.ffn_norm, training)
        return x, weights
