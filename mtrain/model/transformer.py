"""The Transformer encoder-decoder: training forward pass and incremental decoding.

    source tokens -> Embedding -> EncoderLayer x N -> final norm -> memory
    [bos] y       -> Embedding -> DecoderLayer x M (self-attn, cross-attn to memory, FFN)
                  -> final norm -> output projection -> logits

The layers are the standard Pre-LN ones of `layers.py`, or the ablation variant the config
asks for (`variants.py`). The output projection (with a bias when `model.output_bias`)
shares its matrix with the target embedding when `model.tie_embeddings`, and with the source
embedding too when the vocabulary is joint (one vocabulary for both languages; separate
vocabularies of equal size are not tied: their ids mean different pieces). Vocabulary rows
are padded to `model.vocab_multiple`; the logits of padded rows are returned and are -inf,
so softmax gives them probability 0.

With `model.output_vocab=target` the softmax ranges over a fixed subset of the target
vocabulary (`restrict_output`: the pieces of the training targets), stored with the model as
the buffer `output_allowed`: only those rows are multiplied, and every other logit is -inf.

Incremental decoding: `start_decoding` projects the encoder output into every decoder
layer's cross-attention keys/values once; each `decode_step` feeds one token per sentence
at position `state.step` and reuses the cached keys/values of earlier positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mtrain.config import ModelConfig, OutputVocab, Positions
from mtrain.errors import MtrainError
from mtrain.model.attention import padding_bias
from mtrain.model.embeddings import Embedding, padded_rows
from mtrain.model.flops import training_flops_per_target_token
from mtrain.model.layers import make_norm
from mtrain.model.positions import LearnedPositions, RotaryPositions, SinusoidalPositions
from mtrain.model.precision import to_compute_dtype
from mtrain.model.state import DecoderState, LayerCache
from mtrain.model.variants import decoder_layer, encoder_layer
from mtrain.tokenizer.term_factors import FACTORS

if TYPE_CHECKING:
    from mtrain.model.layers import DecoderLayer


def _additive_positions(cfg: ModelConfig) -> nn.Module | None:
    if cfg.positions in (Positions.sinusoidal, Positions.sinusoidal_marian):
        return SinusoidalPositions(cfg.d_model, cfg.max_positions, Positions(cfg.positions), cfg.position_offset)
    if cfg.positions == Positions.learned:
        return LearnedPositions(cfg.d_model, cfg.max_positions)
    return None  # rope acts inside attention; none adds nothing


class Seq2SeqTransformer(nn.Module):
    """Build with `mtrain.model.build_model`, which checks the config first."""

    def __init__(
        self,
        cfg: ModelConfig,
        src_vocab_size: int,
        tgt_vocab_size: int,
        pad_id: int,
        joint_vocab: bool,
        encoder_layers: int,
        decoder_layers: int,
        final_norm: bool,
    ):
        super().__init__()
        d_model = cfg.d_model
        self.src_vocab_size, self.tgt_vocab_size, self.pad_id = src_vocab_size, tgt_vocab_size, pad_id
        self.detach_memory = cfg.detach_memory

        rotary = RotaryPositions(d_model // cfg.heads, cfg.max_positions) if cfg.positions == Positions.rope else None
        src_rows = padded_rows(src_vocab_size, cfg.vocab_multiple)
        tgt_rows = padded_rows(tgt_vocab_size, cfg.vocab_multiple)
        self.src_embed = Embedding(
            src_rows,
            d_model,
            pad_id,
            _additive_positions(cfg),
            cfg.scale_embeddings,
            cfg.dropout,
            factors=FACTORS if cfg.term_factors else 0,
            vocab_size=src_vocab_size,
        )
        self.tgt_embed = Embedding(
            tgt_rows, d_model, pad_id, _additive_positions(cfg), cfg.scale_embeddings, cfg.dropout
        )
        self.encoder = nn.ModuleList(encoder_layer(cfg, rotary) for _ in range(encoder_layers))
        self.decoder = nn.ModuleList(decoder_layer(cfg, rotary) for _ in range(decoder_layers))
        self.encoder_norm = make_norm(cfg.norm_type, d_model) if final_norm else None
        self.decoder_norm = make_norm(cfg.norm_type, d_model) if final_norm else None
        for module in [*self.encoder.modules(), *self.decoder.modules()]:
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)
        self.output_proj = nn.Linear(d_model, tgt_rows, bias=cfg.output_bias)
        nn.init.normal_(self.output_proj.weight, mean=0.0, std=d_model**-0.5)
        if self.output_proj.bias is not None:  # model.output_bias
            nn.init.zeros_(self.output_proj.bias)
        if cfg.tie_embeddings:
            self.output_proj.weight = self.tgt_embed.tokens.weight
            if joint_vocab:
                self.src_embed.tokens.weight = self.tgt_embed.tokens.weight
        # The softmax's rows, ascending (None: all of them). Derived from `output_allowed`
        # and rebuilt after every load, so it is not saved: it can never go stale.
        self.output_ids: Tensor | None
        self.output_allowed: Tensor  # with output_vocab=target only (restrict_output checks)
        self.register_buffer("output_ids", None, persistent=False)
        if cfg.output_vocab == OutputVocab.target:
            # 1 where a piece may be output; every real piece until `restrict_output` says
            # otherwise (a checkpoint's copy replaces it when loaded).
            self.register_buffer("output_allowed", torch.ones(tgt_vocab_size, dtype=torch.uint8))
            self.register_load_state_dict_post_hook(_refresh_after_load)
            self._refresh_output_ids()

    # ------------------------------------------------------------------ training
    def forward(self, src_tokens: Tensor, src_padding_mask: Tensor, tgt_input: Tensor) -> Tensor:
        """Teacher-forced logits (batch, tgt_len, padded vocab) for tgt_input = [bos] y."""
        return self._logits(self.decoder_states(src_tokens, src_padding_mask, tgt_input))

    def decoder_states(self, src_tokens: Tensor, src_padding_mask: Tensor, tgt_input: Tensor) -> Tensor:
        """Teacher-forced final decoder states (batch, tgt_len, d_model), after the final norm:
        what the output projection multiplies (training takes them to the fused loss of
        `mtrain.train.loss`, which projects only the non-pad rows)."""
        memory = self.encode(src_tokens, src_padding_mask)
        if self.detach_memory:
            memory = memory.detach()
        memory = to_compute_dtype(memory)  # once, not once per layer and projection
        src_bias = padding_bias(src_padding_mask)
        x = self.tgt_embed(tgt_input)
        for layer in cast("list[DecoderLayer]", self.decoder):  # (a ModuleList yields Module)
            keys, values = layer.cross_attn.project_memory(memory)
            x, _ = layer(x, keys, values, src_bias)
        return self._final_decoder_norm(x)

    def decoder_states_and_attention(
        self, src_tokens: Tensor, src_padding_mask: Tensor, tgt_input: Tensor, layer: int
    ) -> tuple[Tensor, Tensor]:
        """`decoder_states` and the cross-attention probabilities of decoder layer `layer`,
        every head: (batch, heads, tgt_len, src_len), before dropout (guided alignment)."""
        memory = self.encode(src_tokens, src_padding_mask)
        if self.detach_memory:
            memory = memory.detach()
        memory = to_compute_dtype(memory)
        src_bias = padding_bias(src_padding_mask)
        x = self.tgt_embed(tgt_input)
        wanted = layer % len(self.decoder)
        attention: Tensor | None = None
        for index, layer_module in enumerate(cast("list[DecoderLayer]", self.decoder)):
            keys, values = layer_module.cross_attn.project_memory(memory)
            x, weights = layer_module(x, keys, values, src_bias, need_weights=index == wanted)
            if weights is not None:
                attention = weights
        assert attention is not None  # `wanted` is one of the layers
        return self._final_decoder_norm(x), attention

    @property
    def output_weight(self) -> Tensor:
        """The output projection's (tgt_vocab_size, d_model) rows, without the padded ones."""
        return self.output_proj.weight[: self.tgt_vocab_size]

    @property
    def output_bias(self) -> Tensor | None:
        """The output projection's (tgt_vocab_size,) bias (model.output_bias), without the padded rows."""
        bias = self.output_proj.bias
        return None if bias is None else bias[: self.tgt_vocab_size]

    def restrict_output(self, token_ids: Sequence[int] | Tensor) -> int:
        """Let the softmax range over `token_ids` only (`model.output_vocab=target`); returns
        how many pieces that is."""
        if not hasattr(self, "output_allowed"):
            raise MtrainError("restrict_output needs model.output_vocab=target")
        ids = torch.as_tensor(token_ids, dtype=torch.long).flatten()
        if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= self.tgt_vocab_size:
            raise MtrainError(f"output vocabulary: ids must lie in [0, {self.tgt_vocab_size}), got {ids.numel()} ids")
        self.output_allowed.zero_()
        self.output_allowed[ids.to(self.output_allowed.device)] = 1
        return self._refresh_output_ids()

    def _refresh_output_ids(self) -> int:
        self.output_ids = torch.nonzero(self.output_allowed).squeeze(1)
        return self.output_ids.numel()

    def encode(self, src_tokens: Tensor, src_padding_mask: Tensor) -> Tensor:
        """memory (batch, src_len, d_model); src_padding_mask is True at padding."""
        src_bias = padding_bias(src_padding_mask)
        x = self.src_embed(src_tokens)
        for layer in self.encoder:
            x = layer(x, src_bias)
        memory: Tensor = x if self.encoder_norm is None else self.encoder_norm(x)
        return memory

    def _final_decoder_norm(self, x: Tensor) -> Tensor:
        return x if self.decoder_norm is None else self.decoder_norm(x)

    def _logits(self, states: Tensor) -> Tensor:
        """Logits over the padded vocabulary from final (normed) decoder states; -inf for
        the padded rows and, with a restricted output vocabulary, every piece outside it."""
        if self.output_ids is not None:
            states = to_compute_dtype(states)
            weight = self.output_proj.weight.index_select(0, self.output_ids).to(states.dtype)
            bias = self.output_proj.bias
            allowed = F.linear(states, weight, None if bias is None else bias[self.output_ids].to(states.dtype))
            logits: Tensor = allowed.new_full((*allowed.shape[:-1], self.output_proj.out_features), float("-inf"))
            return logits.index_copy_(-1, self.output_ids, allowed)
        logits = self.output_proj(states)
        if logits.shape[-1] > self.tgt_vocab_size:
            logits[..., self.tgt_vocab_size :] = float("-inf")
        return logits

    # ------------------------------------------------------------------ decoding
    def start_decoding(self, memory: Tensor, src_padding_mask: Tensor) -> DecoderState:
        """Decoding state for a batch; computes each layer's cross-attention keys/values once."""
        memory = to_compute_dtype(memory)
        caches = []
        for layer in cast("list[DecoderLayer]", self.decoder):  # (a ModuleList yields Module)
            # Contiguous once here, rather than copied inside every step's matmul.
            keys, values = layer.cross_attn.project_memory(memory)
            caches.append(LayerCache(keys.contiguous(), values.contiguous()))
        return DecoderState(src_bias=padding_bias(src_padding_mask), layers=caches)

    def decode_step(
        self,
        prev_tokens: Tensor,
        state: DecoderState,
        need_attention: bool = False,
        attention_layer: int | str = "last",
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Logits (batch, padded vocab) for the token after `prev_tokens` (batch,).

        prev_tokens sit at position `state.step` ([bos] at step 0); the step advances by one.
        With `need_attention`, also returns the cross-attention weights averaged over heads:
        (batch, src_len) for one layer (`attention_layer`: "last" or an index) or
        (batch, layers, src_len) for "all"; "LAYER:HEAD" (e.g. "-2:0") gives one head of
        one layer instead of the average (word alignments from a guided head).
        """
        head = None
        if need_attention and isinstance(attention_layer, str) and ":" in attention_layer:
            layer_text, head_text = attention_layer.split(":", 1)
            head = _head_index(head_text, cast("list[DecoderLayer]", self.decoder)[0].cross_attn.heads)
            attention_layer = layer_text
        wanted = _attention_layers(attention_layer, len(self.decoder)) if need_attention else set()
        x = self.tgt_embed(prev_tokens[:, None], offset=state.step)
        attention = []
        for index, (layer, cache) in enumerate(zip(self.decoder, state.layers, strict=True)):
            x, weights = layer(
                x,
                cache.cross_keys,
                cache.cross_values,
                state.src_bias,
                cache=cache,
                offset=state.step,
                need_weights=index in wanted,
            )
            if weights is not None:  # (batch, heads, 1, src_len)
                attention.append(weights[:, :, 0].mean(dim=1) if head is None else weights[:, head, 0])
        state.step += 1
        logits = self._logits(self._final_decoder_norm(x))[:, 0]
        if not need_attention:
            return logits
        if attention_layer == "all":
            return logits, torch.stack(attention, dim=1)
        return logits, attention[0]

    # ------------------------------------------------------------------ accounting
    def flops_per_token(self, src_len: int, tgt_len: int) -> float:
        """Training FLOPs per target token for a pair of these lengths (see `mtrain.model.flops`)."""
        return training_flops_per_target_token(self, src_len, tgt_len)

    def gradient_norm_groups(self) -> dict[str, list[Tensor]]:
        """Parameter groups whose gradient norms the trainer may log. Groups can overlap
        (a tied embedding is in both embedding groups; a cross-attention projection is also in
        its layer's group)."""
        groups: dict[str, list[Tensor]] = {
            "encoder.embeddings": list(self.src_embed.parameters()),
            "decoder.embeddings": list(self.tgt_embed.parameters()),
        }
        for index, layer in enumerate(self.encoder):
            groups[f"encoder.{index}"] = list(layer.parameters())
        for index, layer in enumerate(self.decoder):
            groups[f"decoder.{index}"] = list(layer.parameters())
            for name in ("q_proj", "k_proj", "v_proj"):
                parameters = list(getattr(layer.cross_attn, name).parameters())
                if parameters:  # an identity projection has none
                    groups[f"decoder.{index}.cross_attn.{name}"] = parameters
        for name in ("encoder_norm", "decoder_norm"):
            if getattr(self, name) is not None:
                groups[name] = list(getattr(self, name).parameters())
        if self.output_proj.weight is not self.tgt_embed.tokens.weight:
            groups["output_proj"] = [self.output_proj.weight]
        return groups


def _refresh_after_load(model: Seq2SeqTransformer, _incompatible_keys: object) -> None:
    model._refresh_output_ids()


def _head_index(text: str, heads: int) -> int:
    try:
        head = int(text)
    except ValueError:
        head = heads  # reported below
    if not -heads <= head < heads:
        raise MtrainError(f"attention head {text!r}: the cross-attention has {heads} heads (0..{heads - 1})")
    return head % heads


def _attention_layers(attention_layer: int | str, num_layers: int) -> set[int]:
    if attention_layer == "all":
        return set(range(num_layers))
    if attention_layer == "last":
        return {num_layers - 1}
    try:
        index = int(attention_layer)
    except ValueError:
        index = num_layers  # reported below
    if not -num_layers <= index < num_layers:
        raise MtrainError(
            f"attention_layer: {attention_layer!r} is not last|all or a layer index; "
            f"the decoder has {num_layers} layers"
        )
    return {index % num_layers}
