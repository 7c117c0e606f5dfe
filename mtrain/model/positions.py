"""Position information: sinusoidal (the default), learned, rotary (rope) or none.

Two sinusoid layouts: fairseq's (`sinusoidal`) and Marian's (`sinusoidal_marian`, what
transformers' MarianMTModel computes, so an imported OPUS-MT model adds the same vectors).

Sinusoidal and learned positions are vectors added to the token embeddings
(`mtrain.model.embeddings`); rope instead rotates queries and keys inside *self*-attention,
so attention scores depend on the offset between two positions. Cross-attention gets no
rotation: source and target positions index different sequences. With `none` the model sees
order only through the decoder's causal mask.

Every scheme takes an `offset` so incremental decoding can place one new token at
position `state.step`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from mtrain.config import Positions
from mtrain.errors import MtrainError


def _check_length(end: int, max_positions: int) -> None:
    if end > max_positions:
        raise MtrainError(
            f"model.max_positions: a sequence reaches position {end} but the model has "
            f"{max_positions}; shorten the input or raise model.max_positions"
        )


def sinusoidal_table(num_positions: int, dim: int) -> Tensor:
    """(num_positions, dim): sines in the first half, cosines in the second (fairseq layout)."""
    half = dim // 2
    frequencies = torch.exp(torch.arange(half, dtype=torch.float32) * -(math.log(10000.0) / max(half - 1, 1)))
    angles = torch.arange(num_positions, dtype=torch.float32)[:, None] * frequencies[None, :]
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
    if dim % 2:
        table = torch.cat([table, torch.zeros(num_positions, 1)], dim=1)
    return table


def marian_sinusoidal_table(num_positions: int, dim: int) -> Tensor:
    """(num_positions, dim): sin(pos / 10000^(2i/dim)) in the first half (i = 0, 1, ...), the
    cosines of the same angles in the second (Marian's layout; an odd dim gives the sines one
    more column). Computed in float64 and rounded once, as transformers computes it."""
    exponents = 2 * torch.arange(dim, dtype=torch.float64).div(2, rounding_mode="floor") / dim
    angles = torch.arange(num_positions, dtype=torch.float64)[:, None] / torch.pow(10000.0, exponents)[None, :]
    return torch.cat([torch.sin(angles[:, 0::2]), torch.cos(angles[:, 1::2])], dim=1).float()


def position_table(kind: Positions, num_positions: int, dim: int) -> Tensor:
    """The fixed table of a sinusoidal `kind` (either layout)."""
    if kind == Positions.sinusoidal_marian:
        return marian_sinusoidal_table(num_positions, dim)
    return sinusoidal_table(num_positions, dim)


class SinusoidalPositions(nn.Module):
    """Fixed sinusoids (Vaswani et al. 2017), in the layout `kind` names; not saved in
    checkpoints, since they are recomputed."""

    table: Tensor  # a buffer (register_buffer below)

    def __init__(self, d_model: int, max_positions: int, kind: Positions = Positions.sinusoidal, first_row: int = 0):
        """`first_row`: the table's row of position 0 (`model.position_offset`: M2M100's pad_id + 1)."""
        super().__init__()
        self.max_positions = max_positions
        self.first_row = first_row
        table = position_table(kind, first_row + max_positions, d_model)[first_row:]
        self.register_buffer("table", table, persistent=False)

    def forward(self, length: int, offset: int = 0) -> Tensor:
        """(length, d_model) vectors for positions offset .. offset + length - 1."""
        _check_length(offset + length, self.max_positions)
        return self.table[offset : offset + length]


class LearnedPositions(nn.Module):
    """One trained vector per position, initialised like the token embeddings."""

    def __init__(self, d_model: int, max_positions: int):
        super().__init__()
        self.max_positions = max_positions
        self.weight = nn.Parameter(torch.empty(max_positions, d_model))
        nn.init.normal_(self.weight, mean=0.0, std=d_model**-0.5)

    def forward(self, length: int, offset: int = 0) -> Tensor:
        """(length, d_model) vectors for positions offset .. offset + length - 1."""
        _check_length(offset + length, self.max_positions)
        return self.weight[offset : offset + length]


class _Rotate(torch.autograd.Function):
    """x * cos + rotate_half(x) * sin for the rotate-half layout, where rotate_half(x) =
    [-x2, x1] = roll(x, head_dim / 2) * [-1, 1]: the sign lives in `signed_sin` = [-sin, sin].

    A rotation's backward is the rotation by the opposite angles (its transpose): the same
    three passes with the sine negated, and nothing saved but the two small tables.
    Autograd through the chunk/neg/cat/mul/add formula took twice the passes and kept x.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, cos: Tensor, signed_sin: Tensor) -> Tensor:
        ctx.save_for_backward(cos, signed_sin)
        return _rotate(x, cos, signed_sin)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        cos, signed_sin = ctx.saved_tensors
        return _rotate(grad, cos, -signed_sin), None, None


def _rotate(x: Tensor, cos: Tensor, signed_sin: Tensor) -> Tensor:
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), signed_sin)


class RotaryPositions(nn.Module):
    """Rotary position embedding (Su et al. 2021), rotate-half layout, applied per head.

    One instance is shared by every self-attention module of the model.
    """

    cos: Tensor  # buffers (register_buffer below)
    signed_sin: Tensor

    def __init__(self, head_dim: int, max_positions: int, base: float = 10000.0):
        super().__init__()
        self.max_positions = max_positions
        inverse_frequencies = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        angles = torch.arange(max_positions, dtype=torch.float32)[:, None] * inverse_frequencies[None, :]
        self.register_buffer("cos", torch.cat([angles.cos(), angles.cos()], dim=1), persistent=False)
        # (max_positions, head_dim): [-sin, sin], the sign of rotate_half folded in
        self.register_buffer("signed_sin", torch.cat([-angles.sin(), angles.sin()], dim=1), persistent=False)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """Rotate x (batch, length, heads, head_dim) by the angles of its positions."""
        length = x.shape[1]
        _check_length(offset + length, self.max_positions)
        # Cast the small tables, not x, so bf16 activations stay bf16.
        cos = self.cos[offset : offset + length, None, :].to(x.dtype)
        signed_sin = self.signed_sin[offset : offset + length, None, :].to(x.dtype)
        rotated: Tensor = _Rotate.apply(x, cos, signed_sin)
        return rotated


def position_limit(model: object) -> int | None:
    """How many positions the model can embed (None: no limit, e.g. positions=none).

    The model's `max_positions` if it has one, else the smallest `max_positions` of its
    position modules (sinusoidal/learned tables, rope), which raise past it.
    """
    limit = getattr(model, "max_positions", None)
    if isinstance(limit, int):
        return limit
    if not isinstance(model, nn.Module):  # an engine that states no limit
        return None
    limits = [found for m in model.modules() if isinstance(found := getattr(m, "max_positions", None), int)]
    return min(limits) if limits else None
