"""Where the generator gets next-token logits: the KV cache, or full recomputation.

`CachedStep` feeds one token per hypothesis to `model.decode_step`, which extends each
layer's self-attention cache and reuses the cross-attention keys/values computed once by
`model.start_decoding`. `RecomputeStep` is the reference without a cache: every step it
runs the whole decoder over the whole prefix, as training does (teacher forcing with a
causal mask). It exists to check the cache (same tokens and scores) and to measure what
the cache buys (`scripts/bench_decode.py`); nothing else should use it.

Both are built from the source batch, one row per sentence, and decode `width` rows
(hypotheses) per sentence, sentence-major. They follow the live hypotheses with
`reorder(rows, sentences)`: `rows` selects hypotheses (beam back-pointers and dropped
finished sentences in one index operation), `sentences` the sentences that stay (None: all).
"""

from __future__ import annotations

from typing import Any, Protocol

from torch import Tensor


class DecodingModel(Protocol):
    """What decoding calls: mtrain's Seq2SeqTransformer, or an EnsembleModel of them (whose
    memory is a list of the members' and whose state holds one DecoderState per member)."""

    def encode(self, src_tokens: Tensor, src_padding_mask: Tensor) -> Any: ...

    def start_decoding(self, memory: Any, src_padding_mask: Tensor) -> Any: ...

    def decode_step(
        self, prev_tokens: Tensor, state: Any, need_attention: bool = False, attention_layer: int | str = "last"
    ) -> Tensor | tuple[Tensor, Tensor]: ...

    def __call__(self, src_tokens: Tensor, src_padding_mask: Tensor, tgt_input: Tensor) -> Tensor: ...


class StepFunction(Protocol):
    def __call__(self, prefix: Tensor) -> tuple[Tensor, Tensor | None]:
        """prefix (rows, t+1): bos and the tokens so far. Returns logits (rows, vocab) for
        position t+1 and, when attention was asked for, cross-attention (rows, src_len)."""
        ...

    def reorder(self, rows: Tensor, sentences: Tensor | None) -> None: ...


class CachedStep:
    """Incremental decoding with the model's `DecoderState` (one token per step).

    The state's cross-attention keys/values stay one row per sentence, shared by the
    sentence's hypotheses (`mtrain.model.state`). The first step runs one row per sentence:
    every hypothesis starts as the same [bos], so the `width` rows would compute the same
    logits (in beam search all but one of them are dead anyway). `attention_layer` (None: no
    attention) is passed to `decode_step`: "last", "all" or a layer index (the weights come
    back averaged over heads), or "LAYER:HEAD" (that head's).
    """

    def __init__(
        self,
        model: DecodingModel,
        src_tokens: Tensor,
        memory: Any,  # what model.encode returned
        src_padding_mask: Tensor,
        width: int,
        attention_layer: int | str | None = None,
    ) -> None:
        self.model = model
        self.width = width
        self.attention_layer = attention_layer
        self.state = model.start_decoding(memory, src_padding_mask)
        self.rows_per_sentence = 1  # rows of the self-attention caches per sentence, until reordered

    def __call__(self, prefix: Tensor) -> tuple[Tensor, Tensor | None]:
        if self.state.step != prefix.size(1) - 1:
            raise RuntimeError(f"decoder state is at step {self.state.step}, prefix has {prefix.size(1)} tokens")
        tokens = prefix[:, -1]
        shared = self.state.step == 0 and self.width > 1
        if shared:
            tokens = tokens[:: self.width]  # one [bos] per sentence
        if self.attention_layer is None:
            logits, attention = self.model.decode_step(tokens, self.state), None
            assert isinstance(logits, Tensor)  # without need_attention: the logits alone
        else:
            logits, attention = self.model.decode_step(
                tokens, self.state, need_attention=True, attention_layer=self.attention_layer
            )
        if not shared:
            self.rows_per_sentence = self.width
            return logits, attention

        def expand(t: Tensor) -> Tensor:
            return t.repeat_interleave(self.width, dim=0)

        return expand(logits), (None if attention is None else expand(attention))

    def reorder(self, rows: Tensor, sentences: Tensor | None) -> None:
        # After the shared first step, hypothesis row r of the beam reads sentence r // width's cache row.
        self.state.reorder_hypotheses(rows // (self.width // self.rows_per_sentence), sentences)
        self.rows_per_sentence = self.width


class RecomputeStep:
    """No cache: `model.forward` over the source and the whole prefix each step.

    This is the training path (teacher forcing, causal mask), so it checks the incremental
    path against an independent computation. It re-encodes the source every step too.
    """

    def __init__(
        self,
        model: DecodingModel,
        src_tokens: Tensor,
        memory: Any,  # what model.encode returned
        src_padding_mask: Tensor,
        width: int,
        attention_layer: int | str | None = None,
    ) -> None:
        if attention_layer is not None:
            raise ValueError("attention pictures need the cached decoder (use_cache=True)")
        self.model = model
        self.src_tokens = src_tokens.repeat_interleave(width, dim=0)  # one row per hypothesis
        self.src_padding_mask = src_padding_mask.repeat_interleave(width, dim=0)

    def __call__(self, prefix: Tensor) -> tuple[Tensor, Tensor | None]:
        logits = self.model(self.src_tokens, self.src_padding_mask, prefix)  # (rows, t+1, vocab)
        return logits[:, -1], None

    def reorder(self, rows: Tensor, sentences: Tensor | None) -> None:
        self.src_tokens = self.src_tokens.index_select(0, rows)
        self.src_padding_mask = self.src_padding_mask.index_select(0, rows)
