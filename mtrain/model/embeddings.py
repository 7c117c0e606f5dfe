"""Token ids to the vectors a stack starts from: lookup, scale, positions, dropout.

The lookup table has `padded_rows(vocab_size, vocab_multiple)` rows; rows past the real
vocabulary are never looked up (token ids come from the tokenizer) and exist so that a tied
output projection has a tensor-core-friendly width.

A term-aware model's source embedding (`model.term_factors`) also reads the term factor that
an annotated source id carries (mtrain.source_factors: id = piece + factor * vocabulary
size) and adds that factor's vector, zero-initialised: a plain model's weights compute the same
before the factors are trained.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from mtrain.model.dropout import dropout


def padded_rows(vocab_size: int, multiple: int) -> int:
    return multiple * math.ceil(vocab_size / multiple)


class Embedding(nn.Module):
    """tokens -> Dropout(lookup(tokens) * sqrt(d_model) + positions)."""

    def __init__(
        self,
        rows: int,
        d_model: int,
        pad_id: int,
        positions: nn.Module | None,
        scale: bool,
        dropout_p: float,
        factors: int = 0,
        vocab_size: int = 0,
    ):
        super().__init__()
        self.tokens = nn.Embedding(rows, d_model, padding_idx=pad_id)
        # fairseq's initialisation: unit-norm rows in expectation, so that after the sqrt(d)
        # scale tokens and sinusoids (entries in [-1, 1]) have comparable magnitude.
        nn.init.normal_(self.tokens.weight, mean=0.0, std=d_model**-0.5)
        nn.init.zeros_(self.tokens.weight[pad_id])
        self.positions = positions
        self.scale = math.sqrt(d_model) if scale else 1.0
        self.dropout_p = dropout_p
        # Term factors (source side of a term-aware model): `vocab_size` splits an id into piece and factor.
        self.vocab_size = vocab_size
        self.factors = nn.Embedding(factors, d_model) if factors else None
        if self.factors is not None:
            nn.init.zeros_(self.factors.weight)

    def forward(self, tokens: Tensor, offset: int = 0) -> Tensor:
        """tokens (batch, length) at positions offset.. -> (batch, length, d_model)."""
        if self.factors is None:
            x = self.tokens(tokens)
        else:
            x = self.tokens(tokens % self.vocab_size)
        if self.scale != 1.0:
            x = x * self.scale
        if self.factors is not None:
            x = x + self.factors(torch.div(tokens, self.vocab_size, rounding_mode="floor"))
        if self.positions is not None:
            x = x + self.positions(tokens.shape[1], offset)
        return dropout(x, self.dropout_p, self.training)
