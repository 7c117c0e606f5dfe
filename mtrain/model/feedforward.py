"""The position-wise feed-forward sublayer: relu, gelu, silu or swiglu.

relu/gelu/silu: down(act(up(x))) with a hidden size of `ffn_dim`.
swiglu (Shazeer 2020): down(silu(gate(x)) * up(x)). It has three matrices instead of two,
so its hidden size is 2/3 of `ffn_dim` (rounded up to a multiple of 8): the parameter count
stays within 1% of the two-matrix FFN (benchmark size: 528k vs 524k weights per layer).
"""

from __future__ import annotations

import math

import torch.nn.functional as F
from torch import Tensor, nn

from mtrain.config import Activation
from mtrain.model.dropout import dropout
from mtrain.model.precision import to_compute_dtype


def swiglu_hidden_size(ffn_dim: int) -> int:
    return 8 * math.ceil(2 * ffn_dim / 3 / 8)


class FeedForward(nn.Module):
    def __init__(self, d_model: int, ffn_dim: int, activation: Activation, activation_dropout: float):
        super().__init__()
        self.activation = Activation(activation)  # (a config dataclass built by hand may hold the plain string)
        self.activation_dropout = activation_dropout
        gated = self.activation.gated
        hidden = swiglu_hidden_size(ffn_dim) if gated else ffn_dim
        self.gate = nn.Linear(d_model, hidden) if gated else None
        self.up = nn.Linear(d_model, hidden)
        self.down = nn.Linear(hidden, d_model)

    def forward(self, x: Tensor) -> Tensor:
        """(batch, length, d_model) -> (batch, length, d_model)."""
        x = to_compute_dtype(x)
        if self.gate is not None:
            hidden = F.silu(self.gate(x)) * self.up(x)
        elif self.activation == Activation.gelu:
            hidden = F.gelu(self.up(x))
        elif self.activation == Activation.silu:
            hidden = F.silu(self.up(x))
        else:
            hidden = F.relu(self.up(x))
        hidden = dropout(hidden, self.activation_dropout, self.training)
        output: Tensor = self.down(hidden)
        return output
