"""What the decoder carries from one incremental decoding step to the next.

`Seq2SeqTransformer.start_decoding` fills a `DecoderState` once per source batch: each
decoder layer's cross-attention keys and values (projected from the encoder output once, not
once per step) and the source padding mask. Each `decode_step` appends that step's
self-attention keys and values to the layer caches and advances `step`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class LayerCache:
    """One decoder layer's keys and values, each (batch, heads, length, head_dim)."""

    cross_keys: Tensor  # length = src_len, fixed for the whole decode
    cross_values: Tensor
    self_keys: Tensor | None = None  # length = steps so far (rotated already when rope is on)
    self_values: Tensor | None = None

    def extend(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """Append this step's self-attention keys/values; return all of them so far."""
        if self.self_keys is not None:
            keys = torch.cat([self.self_keys, keys], dim=2)
            values = torch.cat([self.self_values, values], dim=2)
        self.self_keys, self.self_values = keys, values
        return keys, values

    def reorder(self, index: Tensor) -> None:
        self.cross_keys = self.cross_keys.index_select(0, index)
        self.cross_values = self.cross_values.index_select(0, index)
        if self.self_keys is not None:
            self.self_keys = self.self_keys.index_select(0, index)
            self.self_values = self.self_values.index_select(0, index)


@dataclass
class DecoderState:
    """Incremental decoding state of a batch of (hypotheses of) sentences."""

    src_bias: Tensor  # (batch, 1, 1, src_len) additive: 0 for real tokens, -inf at padding
    layers: list[LayerCache] = field(default_factory=list)
    step: int = 0  # position of the next token fed to decode_step

    @property
    def batch_size(self) -> int:
        return self.src_bias.shape[0]

    def reorder(self, index: Tensor) -> None:
        """Keep rows `index` of every cached tensor, in that order (one index_select each).

        Used to follow beam back-pointers and to drop finished sentences: `index` may be
        shorter than the batch and may repeat rows.
        """
        self.src_bias = self.src_bias.index_select(0, index)
        for cache in self.layers:
            cache.reorder(index)
