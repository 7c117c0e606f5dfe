"""The standard encoder and decoder layers: Pre-LN (Xiong et al. 2020), as the seed draws them.

Each sublayer has its own norm and sits in a residual connection that adds the
*un-normalised* stream: x + Dropout(Sublayer(Norm(x))). The stream is never normalised
inside the stack; the final norm of each stack (`model.final_norm`) does that once at the end.

The ablation bench's variants (post-norm, a normalised residual, other decoder orders) are
subclasses in `variants.py`, which also picks the class a config gets. `model.shared_norm`
only changes construction here: one norm module serves every sublayer of a layer.
"""

from __future__ import annotations

from torch import Tensor, nn

from mtrain.config import ModelConfig, NormType
from mtrain.model.attention import CrossAttention, SelfAttention
from mtrain.model.dropout import dropout_add
from mtrain.model.feedforward import FeedForward
from mtrain.model.positions import RotaryPositions
from mtrain.model.state import LayerCache


def make_norm(norm_type: NormType, d_model: int) -> nn.Module:
    if norm_type == NormType.rmsnorm:
        return nn.RMSNorm(d_model, eps=1e-6)
    return nn.LayerNorm(d_model)


def _norms(cfg: ModelConfig, count: int) -> list[nn.Module]:
    if cfg.shared_norm:
        return [make_norm(cfg.norm_type, cfg.d_model)] * count
    return [make_norm(cfg.norm_type, cfg.d_model) for _ in range(count)]


class EncoderLayer(nn.Module):
    """x + SelfAttn(Norm(x)), then x + FFN(Norm(x))."""

    def __init__(self, cfg: ModelConfig, rotary: RotaryPositions | None):
        super().__init__()
        self.dropout_p = cfg.dropout  # on each sublayer's output
        self.self_attn_norm, self.ffn_norm = _norms(cfg, 2)
        self.self_attn = SelfAttention(cfg.d_model, cfg.heads, cfg.attention_dropout, cfg.attention_impl, rotary)
        self.ffn = FeedForward(cfg.d_model, cfg.ffn_dim, cfg.activation, cfg.activation_dropout)

    def forward(self, x: Tensor, src_bias: Tensor | None) -> Tensor:
        """x (batch, src_len, d_model); src_bias (batch, 1, 1, src_len) masks padding (None: none)."""
        p, training = self.dropout_p, self.training
        x = dropout_add(x, self.self_attn(self.self_attn_norm(x), bias=src_bias), p, training)
        x = dropout_add(x, self.ffn(self.ffn_norm(x)), p, training)
        return x


class DecoderLayer(nn.Module):
    """x + SelfAttn(Norm(x)) (causal), then x + CrossAttn(Norm(x), memory), then x + FFN(Norm(x))."""

    def __init__(self, cfg: ModelConfig, rotary: RotaryPositions | None):
        super().__init__()
        self.dropout_p = cfg.dropout  # on each sublayer's output
        self.self_attn_norm, self.cross_attn_norm, self.ffn_norm = _norms(cfg, 3)
        self.self_attn = SelfAttention(cfg.d_model, cfg.heads, cfg.attention_dropout, cfg.attention_impl, rotary)
        self.cross_attn = CrossAttention(
            cfg.d_model,
            cfg.heads,
            cfg.attention_dropout,
            cfg.attention_impl,
            q_proj=cfg.cross_q_proj,
            k_proj=cfg.cross_k_proj,
            v_proj=cfg.cross_v_proj,
        )
        self.ffn = FeedForward(cfg.d_model, cfg.ffn_dim, cfg.activation, cfg.activation_dropout)

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
        """x (batch, tgt_len, d_model) -> same shape, and the cross-attention weights of
        every head (batch, heads, tgt_len, src_len) when `need_weights`.

        cross_keys/values come from `self.cross_attn.project_memory`. With a `cache`, x is the
        single position `offset` of incremental decoding.
        """
        p, training = self.dropout_p, self.training
        x = dropout_add(x, self.self_attn(self.self_attn_norm(x), causal=True, cache=cache, offset=offset), p, training)
        attended, weights = self.cross_attn(self.cross_attn_norm(x), cross_keys, cross_values, src_bias, need_weights)
        x = dropout_add(x, attended, p, training)
        x = dropout_add(x, self.ffn(self.ffn_norm(x)), p, training)
        return x, weights
