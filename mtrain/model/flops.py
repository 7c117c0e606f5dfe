"""Training FLOPs per target token, for model FLOPs utilisation (MFU).

The standard accounting (Kaplan et al. 2020; PaLM appendix B): a matrix product of an
(n x k) by a (k x m) matrix is 2nkm FLOPs, the backward pass costs twice the forward, so
training = 3 x forward. Norms, softmax, dropout, biases and embedding lookups are left out.

For one sentence pair with S source and T target tokens, d = d_model, and W(.) the number of
weights of the Linear layers named (q/k/v/out projections, FFN matrices; absent identity
projections count 0):

    forward =  S * sum_enc [2 W(self_attn) + 2 W(ffn)]                  encoder projections
             + L_enc * 4 S^2 d                                          encoder QK^T and AV
             + T * sum_dec [2 W(self_attn) + 2 W(cross q, out) + 2 W(ffn)]
             + S * sum_dec 2 W(cross k, v)                              memory projected once
             + L_dec * (4 T^2 d + 4 T S d)                              decoder QK^T and AV
             + T * 2 d V                                                output projection
    flops_per_token = 3 * forward / T

Attention counts the full T x T score matrix (that is what is computed; causal masking
does not skip work), and V is the padded vocabulary (the rows really multiplied), or the
restricted output vocabulary's size with `model.output_vocab=target`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, cast

from torch import Tensor, nn

if TYPE_CHECKING:
    from mtrain.model.layers import DecoderLayer


def matmul_weights(module: nn.Module) -> int:
    """Weights of the Linear layers in `module` (0 for an identity): each is used once per token."""
    return sum(m.in_features * m.out_features for m in module.modules() if isinstance(m, nn.Linear))


def training_flops_per_target_token(
    encoder: Iterable[nn.Module],
    decoder: Iterable[nn.Module],
    output_proj: nn.Linear,
    output_ids: Tensor | None,
    src_len: int,
    tgt_len: int,
) -> float:
    """The count above for a model's layer stacks and output projection (`output_ids`: the
    restricted output vocabulary's rows, None for all). The model passes its parts, so this
    module needs nothing of `Seq2SeqTransformer`, which calls it."""
    S, T = src_len, tgt_len
    d = output_proj.in_features
    forward = 0
    for layer in encoder:
        forward += S * 2 * matmul_weights(layer) + 4 * S * S * d
    for layer in cast("Iterable[DecoderLayer]", decoder):  # (a ModuleList yields Module)
        memory_side = matmul_weights(layer.cross_attn.k_proj) + matmul_weights(layer.cross_attn.v_proj)
        forward += T * 2 * (matmul_weights(layer) - memory_side) + S * 2 * memory_side
        forward += 4 * T * T * d + 4 * T * S * d
    vocab = output_proj.out_features if output_ids is None else output_ids.numel()
    forward += T * 2 * d * vocab
    return 3.0 * forward / T
