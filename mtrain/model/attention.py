"""Multi-head attention: self-attention (with a KV cache for decoding) and cross-attention.

Both have separate W_Q, W_K, W_V and W_O projections. Cross-attention takes queries from the
decoder and keys/values from the encoder output; for the ablation bench any of its W_Q, W_K,
W_V can be left out (the identity: an `nn.Identity` with no parameters takes its place).

The attention itself, softmax(QK^T/sqrt(d) + mask) V, is a parameter-free submodule
(`DotProductAttention`) of each attention module, so that an instrument can hook it and see
the queries and keys (`mtrain.model.instruments`). It runs one of two ways (`model.attention_impl`):
- `sdpa`: `torch.nn.functional.scaled_dot_product_attention`, a fused kernel;
- `math`: matmul, additive mask, softmax, matmul, written out below.
`auto` takes sdpa on CUDA and math on CPU, where it trains faster for the short sentences
of small corpora (the measurements are in `uses_sdpa`).

Masks are additive biases, 0 where attention is allowed and -inf where it is not, so the
backward pass of masking is free; causal masking is a flag. A batch without source padding
has no mask at all (`padding_bias(None)`), and the decoder's self-attention never has one
(causal alone: a real target position only sees earlier, real positions; padded positions are
unlabelled, so what they see is never trained on): SDPA without a mask may take the flash kernel
on CUDA, which refuses any mask (`mtrain.model.attention_backends` reports which kernel runs).
"""

from __future__ import annotations

import math
from typing import overload

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mtrain.config import AttentionImpl
from mtrain.model.dropout import dropout
from mtrain.model.positions import RotaryPositions
from mtrain.model.precision import to_compute_dtype
from mtrain.model.state import LayerCache


@overload
def padding_bias(padding_mask: Tensor) -> Tensor: ...
@overload
def padding_bias(padding_mask: None) -> None: ...
def padding_bias(padding_mask: Tensor | None) -> Tensor | None:
    """(batch, 1, 1, len) additive bias from a (batch, len) mask that is True at padding;
    None (no padding) gives None: attention without a mask."""
    if padding_mask is None:
        return None
    bias = torch.zeros(padding_mask.shape, dtype=torch.float32, device=padding_mask.device)
    return bias.masked_fill_(padding_mask, float("-inf"))[:, None, None, :]


def _causal_bias(q_len: int, k_len: int, device: torch.device) -> Tensor:
    """(q_len, k_len) fp32, -inf where key position > query position (queries are the
    last q_len positions)."""
    full = torch.full((q_len, k_len), float("-inf"), device=device)
    return torch.triu(full, diagonal=k_len - q_len + 1)


def split_heads(x: Tensor, heads: int) -> Tensor:
    """(batch, length, d_model) -> (batch, heads, length, head_dim), a view."""
    batch, length, d_model = x.shape
    return x.view(batch, length, heads, d_model // heads).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """(batch, heads, length, head_dim) -> (batch, length, d_model)."""
    batch, heads, length, head_dim = x.shape
    return x.transpose(1, 2).reshape(batch, length, heads * head_dim)


def fused_linear(x: Tensor, projections: list[nn.Linear]) -> Tensor:
    """[p(x) for p in projections], concatenated on the last dim, as one matrix product.

    W_Q, W_K and W_V stay separate parameters; multiplying their concatenation reads x
    once and makes one larger matmul and one bias-gradient reduction instead of three, and
    the input gradient comes back as one product instead of three summed ones.
    """
    weight = torch.cat([projection.weight for projection in projections])
    bias = torch.cat([projection.bias for projection in projections])
    return F.linear(x, weight, bias)


def attention_probabilities(q: Tensor, k: Tensor, bias: Tensor | None, causal: bool) -> Tensor:
    """softmax(q k^T / sqrt(head_dim) + mask), fp32 (batch, heads, q_len, k_len), from
    (batch, heads, length, head_dim) queries and keys; `bias` is an fp32 additive mask
    broadcastable to the scores (0 or -inf)."""
    if causal:
        causal_bias = _causal_bias(q.shape[-2], k.shape[-2], q.device)
        bias = causal_bias if bias is None else bias + causal_bias
    scores = torch.matmul(q, k.transpose(-2, -1))  # (batch, heads, q_len, k_len)
    scale = 1.0 / math.sqrt(q.shape[-1])
    # Softmax in fp32: more accurate, and on CPU faster than bf16 softmax (forward and
    # backward). Adding the fp32 mask does the upcast in the same pass.
    scores = scores * scale if bias is None else torch.add(bias, scores, alpha=scale)
    return torch.softmax(scores, dim=-1, dtype=torch.float32)


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    causal: bool,
    dropout_p: float,
    use_sdpa: bool,
    need_weights: bool,
) -> tuple[Tensor, Tensor | None]:
    """softmax(q k^T / sqrt(head_dim) + mask) v over (batch, heads, length, head_dim) inputs.

    `bias` is an fp32 additive mask broadcastable to the scores (0 or -inf); `dropout_p` is
    0 outside training. Returns the output (batch, heads, q_len, head_dim) and, when
    `need_weights`, the fp32 attention probabilities (batch, heads, q_len, k_len) before dropout.
    """
    if use_sdpa and not need_weights:
        if bias is not None:
            bias = bias.to(q.dtype)  # (batch, 1, 1, k_len): a few bytes
        output = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p, is_causal=causal)
        return output, None
    weights = attention_probabilities(q, k, bias, causal)
    output = torch.matmul(dropout(weights.to(v.dtype), dropout_p, training=dropout_p > 0.0), v)
    return output, (weights if need_weights else None)


class DotProductAttention(nn.Module):
    """`attend` with this module's dropout (in training) and implementation; no parameters.

    Called with positional arguments (q, k, v, bias, causal, need_weights), which is what a
    forward hook sees (`mtrain.model.instruments` reads q, k, bias and causal).
    """

    def __init__(self, attention_dropout: float, impl: AttentionImpl):
        super().__init__()
        self.attention_dropout = attention_dropout
        self.impl = impl

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, causal: bool, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        dropout_p = self.attention_dropout if self.training else 0.0
        return attend(q, k, v, bias, causal, dropout_p, uses_sdpa(self.impl, q), need_weights)


class SelfAttention(nn.Module):
    """Multi-head self-attention; with rope, queries and keys are rotated by position."""

    def __init__(
        self, d_model: int, heads: int, attention_dropout: float, impl: AttentionImpl, rotary: RotaryPositions | None
    ):
        super().__init__()
        self.heads = heads
        self.rotary = rotary
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.attention = DotProductAttention(attention_dropout, impl)

    def forward(
        self,
        x: Tensor,
        bias: Tensor | None = None,
        causal: bool = False,
        cache: LayerCache | None = None,
        offset: int = 0,
    ) -> Tensor:
        """x (batch, length, d_model) -> (batch, length, d_model).

        `bias` (batch, 1, 1, length) masks padded keys; `causal` hides later positions. With a
        `cache` (incremental decoding, one new position at `offset`) the new keys/values are
        appended to it and the query attends to every cached position.
        """
        x = to_compute_dtype(x)
        batch, length, _ = x.shape
        qkv = fused_linear(x, [self.q_proj, self.k_proj, self.v_proj])  # (batch, length, 3 * d_model)
        qk, v = qkv.split([2 * qkv.shape[-1] // 3, qkv.shape[-1] // 3], dim=-1)
        qk = qk.view(batch, length, 2 * self.heads, -1)  # queries' heads, then keys'
        if self.rotary is not None:
            qk = self.rotary(qk, offset)  # queries and keys in one pass
        q, k = qk.transpose(1, 2).chunk(2, dim=1)
        v = split_heads(v, self.heads)
        if cache is not None:
            k, v = cache.extend(k, v)
            causal = False  # the single new query may see every cached key
        output, _ = self.attention(q, k, v, bias, causal)
        projected: Tensor = self.out_proj(merge_heads(output))
        return projected


class CrossAttention(nn.Module):
    """Multi-head attention from decoder queries to the encoder output (`memory`)."""

    def __init__(
        self,
        d_model: int,
        heads: int,
        attention_dropout: float,
        impl: AttentionImpl,
        q_proj: bool = True,
        k_proj: bool = True,
        v_proj: bool = True,
    ):
        super().__init__()
        self.heads = heads
        self.q_proj = nn.Linear(d_model, d_model) if q_proj else nn.Identity()
        self.k_proj = nn.Linear(d_model, d_model) if k_proj else nn.Identity()
        self.v_proj = nn.Linear(d_model, d_model) if v_proj else nn.Identity()
        self.out_proj = nn.Linear(d_model, d_model)
        self.attention = DotProductAttention(attention_dropout, impl)

    def project_memory(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values (batch, heads, src_len, head_dim) from memory (batch, src_len, d_model).

        Called once per forward pass, or once per decode by `start_decoding`.
        """
        if isinstance(self.k_proj, nn.Linear) and isinstance(self.v_proj, nn.Linear):
            keys, values = fused_linear(memory, [self.k_proj, self.v_proj]).chunk(2, dim=-1)
        else:
            keys, values = self.k_proj(memory), self.v_proj(memory)
        return split_heads(keys, self.heads), split_heads(values, self.heads)

    def forward(
        self, x: Tensor, keys: Tensor, values: Tensor, bias: Tensor | None, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """x (rows, tgt_len, d_model) -> output (rows, tgt_len, d_model) and, when asked,
        the attention probabilities of every head (rows, heads, tgt_len, src_len).

        keys/values (sentences, heads, src_len, head_dim) and bias (sentences, 1, 1, src_len;
        None: no source padding) have one row per sentence; x has `rows = sentences x hypotheses` rows, sentence-major
        (1 hypothesis except in beam search). A sentence's hypotheses share its keys/values:
        their queries are attended as more query positions of that sentence, so the
        keys/values are never copied per hypothesis.
        """
        rows, tgt_len, d_model = x.shape
        x = x.reshape(keys.shape[0], -1, d_model)  # (sentences, hypotheses * tgt_len, d_model)
        q = split_heads(self.q_proj(to_compute_dtype(x)), self.heads)
        output, weights = self.attention(q, keys, values, bias, False, need_weights)
        output = self.out_proj(merge_heads(output)).view(rows, tgt_len, d_model)
        if weights is None:
            return output, None
        sentences, heads, _, src_len = weights.shape  # queries: hypotheses x tgt_len per sentence
        per_row = weights.view(sentences, heads, -1, tgt_len, src_len).transpose(1, 2)
        return output, per_row.reshape(rows, heads, tgt_len, src_len)


def uses_sdpa(impl: AttentionImpl, x: Tensor) -> bool:
    """`auto` means sdpa on CUDA (fused flash/memory-efficient kernels) and math on CPU.

    Measured with scripts/bench_attention.py on the benchmark CPU (AMD EPYC, AVX512-BF16,
    2 threads, shared machine: best of interleaved rounds), benchmark-size model, a batch of
    200 sentences of 12-18 tokens (2,992 target tokens), forward+backward+loss:
                                   sdpa               math
        bf16 autocast, dropout 0.1  751 ms  3,982 tok/s   505 ms  5,921 tok/s
        bf16 autocast, dropout 0    696 ms  4,298 tok/s   476 ms  6,291 tok/s
        fp32, dropout 0.1          1197 ms  2,500 tok/s  1137 ms  2,632 tok/s
    The attention alone (200 x 18 tokens, 4 heads, forward+backward, 1 thread): bf16 sdpa
    44 ms, math 7 ms; fp32 both 10 ms. CPU flash attention's blocking does not pay for
    18-token sequences, and its bf16 path is slow.
    """
    return impl == AttentionImpl.sdpa or (impl == AttentionImpl.auto and x.device.type != "cpu")
