"""Dropout with a random mask that is cheap to make on CPU, and dropout fused into a residual add.

`torch.nn.functional.dropout` draws one Bernoulli sample per element (`bernoulli_`); on the
benchmark CPU that was about a third of a training step for Multi30k-sized batches. Here
one 64-bit draw of torch's default generator gives four independent 16-bit uniform lanes,
and `torch.ge(lanes, threshold, out=mask)` writes the keep mask (0 or 1) straight into the
activation's dtype, so applying it is a plain vectorised multiply (mixed bool/float
arithmetic takes a slow path on CPU). The drop probability is rounded to a multiple of
2**-16 (0.1 becomes 0.100006); kept values are scaled by the exact inverse of the keep
probability, so expectations are unchanged. Runs stay reproducible under `torch.manual_seed`.

Measured on the benchmark CPU, one thread, a (200, 18, 256) activation, best of many runs
(the machine is shared, so minima are the honest numbers):
- forward only: `F.dropout` fp32 or bf16 4.7 ms (`bernoulli_` alone 4.2 ms); this 1.0 ms,
  0.58 of it the random number generator.
- residual + dropout, forward + backward, fp32 stream + bf16 sublayer output:
  bool mask, multiply, then add 3.9 ms; bool mask fused into one addcmul 2.7 ms;
  `dropout_add` (mask in y's dtype, one addcmul) 1.7 ms; no dropout 0.4 ms.
- whole benchmark model, bf16, 2 threads (scripts/bench_attention.py): 505 ms per
  forward+backward with this, 558 ms with `F.dropout`, 476 ms without dropout.
On CUDA `F.dropout` is one fused kernel, so it is used there unchanged; so it is under
torch.compile on a CPU, where the mask's in-place `random_` cannot be traced (each dropout
would split the graph) and inductor generates its own mask inside the fused kernels.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

_LANES = 2**16  # a 16-bit lane is uniform over this many values


def keep_mask(like: Tensor, p: float) -> tuple[Tensor, float]:
    """A mask shaped and typed like `like`, 1 where an element is kept (probability ~1-p)
    and 0 where it is dropped, and the scale 1 / P(kept)."""
    numel = like.numel()
    draws = torch.empty((numel + 3) // 4, dtype=torch.int64, device=like.device)
    # from=-2**63 with no upper bound asks for all 64 bits; `random_()` alone leaves the
    # sign bit at zero, which would bias every fourth lane.
    draws.random_(-(2**63), None)
    lanes = draws.view(torch.int16)[:numel].view(like.shape)  # uniform over [-2**15, 2**15)
    dropped_values = round(p * _LANES)
    mask = torch.empty(like.shape, dtype=like.dtype, device=like.device)
    torch.ge(lanes, dropped_values - _LANES // 2, out=mask)
    return mask, _LANES / (_LANES - dropped_values)


class _Dropout(torch.autograd.Function):
    """y * mask * scale."""

    @staticmethod
    def forward(ctx: Any, y: Tensor, p: float) -> Tensor:
        mask, scale = keep_mask(y, p)
        ctx.save_for_backward(mask)
        ctx.scale = scale
        return torch.mul(y, mask).mul_(scale)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        (mask,) = ctx.saved_tensors
        return torch.mul(grad, mask).mul_(ctx.scale), None


class _DropoutAdd(torch.autograd.Function):
    """x + y * mask * scale in one pass; x may be fp32 while y is bf16 (autocast)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, y: Tensor, p: float) -> Tensor:
        mask, scale = keep_mask(y, p)
        ctx.save_for_backward(mask)
        ctx.scale = scale
        return torch.addcmul(x, y, mask, value=scale)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, None]:
        (mask,) = ctx.saved_tensors
        # Cast first so the multiplies run in y's (possibly narrower) dtype; out of place,
        # since `grad` itself is x's gradient (and `.to` returns it when dtypes match).
        return grad, torch.mul(grad.to(mask.dtype), mask).mul_(ctx.scale), None


def dropout(y: Tensor, p: float, training: bool) -> Tensor:
    """Inverted dropout: zero each element with probability p and rescale the rest."""
    if not training or p == 0.0:
        return y
    if y.device.type != "cpu" or torch.compiler.is_compiling():
        return F.dropout(y, p, training=True)
    dropped: Tensor = _Dropout.apply(y, p)
    return dropped


def dropout_add(x: Tensor, y: Tensor, p: float, training: bool) -> Tensor:
    """x + dropout(y): the residual connection around a sublayer with output y."""
    if not training or p == 0.0:
        return x + y
    if y.device.type != "cpu" or torch.compiler.is_compiling():
        return x + F.dropout(y, p, training=True)
    summed: Tensor = _DropoutAdd.apply(x, y, p)
    return summed
