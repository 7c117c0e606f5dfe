"""What the decoder carries from one incremental decoding step to the next.

`Seq2SeqTransformer.start_decoding` fills a `DecoderState` once per source batch: each
decoder layer's cross-attention keys and values (projected from the encoder output once, not
once per step) and the source padding mask, one row per sentence. Each `decode_step` appends
that step's self-attention keys and values to the layer caches and advances `step`.

In beam search a sentence has several hypotheses: the self-attention caches have one row per
hypothesis, while the cross-attention keys/values stay one row per sentence, shared by its
hypotheses (`CrossAttention` groups their queries), so following the beam back-pointers
never copies them (it was 22% of beam-search time when they were copied per hypothesis).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class LayerCache:
    """One decoder layer's keys and values, each (rows, heads, length, head_dim)."""

    cross_keys: Tensor  # one row per sentence; length = src_len, fixed for the whole decode
    cross_values: Tensor
    # One row per hypothesis; length = steps so far (rotated already when rope is on).
    self_keys: Tensor | None = None
    self_values: Tensor | None = None

    def extend(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """Append this step's self-attention keys/values; return all of them so far."""
        if self.self_keys is not None and self.self_values is not None:  # (set together)
            keys = torch.cat([self.self_keys, keys], dim=2)
            values = torch.cat([self.self_values, values], dim=2)
        self.self_keys, self.self_values = keys, values
        return keys, values

    def reorder(self, rows: Tensor, sentences: Tensor | None) -> None:
        """Keep hypotheses `rows` of the self-attention cache and `sentences` of the
        cross-attention keys/values (None: all sentences stay, nothing is copied)."""
        if sentences is not None:
            self.cross_keys = self.cross_keys.index_select(0, sentences)
            self.cross_values = self.cross_values.index_select(0, sentences)
        if self.self_keys is not None and self.self_values is not None:
            self.self_keys = self.self_keys.index_select(0, rows)
            self.self_values = self.self_values.index_select(0, rows)


@dataclass
class DecoderState:
    """Incremental decoding state of a batch of (hypotheses of) sentences."""

    src_bias: Tensor  # (sentences, 1, 1, src_len) additive: 0 for real tokens, -inf at padding
    layers: list[LayerCache] = field(default_factory=list)
    step: int = 0  # position of the next token fed to decode_step

    @property
    def batch_size(self) -> int:
        return self.src_bias.shape[0]

    def reorder(self, index: Tensor) -> None:
        """Keep rows `index` of every cached tensor, in that order (one index_select each),
        for a state with one hypothesis per sentence (greedy decoding, tests).

        `index` may be shorter than the batch (finished sentences dropped) and may repeat rows.
        """
        self.reorder_hypotheses(index, index)

    def reorder_hypotheses(self, rows: Tensor, sentences: Tensor | None) -> None:
        """Follow beam back-pointers and drop finished sentences.

        The self-attention caches hold one row per hypothesis (sentence-major: a sentence's
        hypotheses are consecutive rows) and keep rows `rows`; the cross-attention keys/values
        and the source bias hold one row per sentence, shared by its hypotheses, and keep
        sentences `sentences` (None: every sentence stays and they are not touched).
        """
        if sentences is not None:
            self.src_bias = self.src_bias.index_select(0, sentences)
        for cache in self.layers:
            cache.reorder(rows, sentences)
