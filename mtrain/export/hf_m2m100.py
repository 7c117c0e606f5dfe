"""A run that started from M2M100 or NLLB-200, written back as an M2M100ForConditionalGeneration.

A run whose tokenizer is fairseq's (sentencepiece.bpe.model with vocab.json or tokenizer.json:
it started from an imported M2M100/NLLB model, mtrain.train.hf_parent) exports as the
architecture it came from, so that a fine-tuned NLLB model loads in transformers, CTranslate2's
TransformersConverter and everything built on them as the published ones do:

    model key                   M2M100Config
    norm_position pre           its layers (post: refused), a final LayerNorm after each stack
    norm_type layernorm         nn.LayerNorm, eps 1e-5 in both (rmsnorm, shared_norm: refused)
    activation relu|gelu        activation_function (silu, swiglu: refused)
    positions sinusoidal        its sinusoids, which transformers recomputes, numbered from
    position_offset = pad + 1   pad_token_id + 1 (any other numbering: refused)
    max_positions               max_position_embeddings
    scale_embeddings            scale_embedding
    tie_embeddings              one matrix for both stacks and the output (untied: refused)
    output_bias, output_vocab   refused: M2M100 has no final_logits_bias
    vocab_multiple              padded rows are cut: vocab_size is the tokenizer's

The decoder starts from `</s>` (decoder_start_token_id) and its first output is the target
language's token: generation_config.json forces it (`forced_bos_token_id`) when the run
translates into one language; a multilingual run leaves it to the caller
(`generate(..., forced_bos_token_id=tokenizer.convert_tokens_to_ids("fra_Latn"))`).
The tokenizer files are the run's own (`tokenizer/`: the imported model's, or the trimmed
ones: mtrain.tokenizer.trimmed_vocab), so AutoTokenizer gives the ids mtrain trained with.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from torch import Tensor

from mtrain.checkpoint.hf_weights import layer_names
from mtrain.config import (
    Activation,
    DecoderOrder,
    ModelConfig,
    NormPosition,
    NormType,
    Positions,
    resolved_model,
    to_plain,
)
from mtrain.errors import MtrainError
from mtrain.export.ctranslate2_spec import INFERENCE_IRRELEVANT, MAPPED
from mtrain.export.hf_model import bart_family_config
from mtrain.tokenizer import Tokenizer

if TYPE_CHECKING:  # an optional dependency, imported when an export runs
    from transformers import M2M100ForConditionalGeneration

ARCHITECTURE = "M2M100ForConditionalGeneration"
_ACTIVATION_NAMES = {Activation.relu: "relu", Activation.gelu: "gelu"}
BOS_PIECE = "<s>"  # M2M100's bos_token: never emitted, never a decoder start


def check_m2m100_exportable(cfg: ModelConfig, tokenizer: Tokenizer) -> None:
    """Raise MtrainError naming the first setting an M2M100ForConditionalGeneration cannot represent."""
    defaults = {field.name: field.default for field in fields(ModelConfig)}
    plain = to_plain(cfg)
    for name, value in plain.items():
        if name in MAPPED or name in INFERENCE_IRRELEVANT:
            continue
        if name not in defaults or value != defaults[name]:
            raise MtrainError(
                f"model.{name}={value!r}: format=hf does not know this setting; only models that leave "
                "it at its default can be exported to transformers"
            )
    cfg = resolved_model(cfg)
    m2m100 = "format=hf writes a run with M2M100's tokenizer as an M2M100ForConditionalGeneration"
    first_row = tokenizer.pad_id + 1
    refusals = [
        (cfg.norm_position != NormPosition.pre, "norm_position", "whose layers are pre-norm"),
        (not cfg.final_norm, "final_norm", "which ends each stack with a LayerNorm"),
        (cfg.norm_type != NormType.layernorm or cfg.shared_norm, "norm_type", "whose sublayers have a LayerNorm each"),
        (Activation(cfg.activation) not in _ACTIVATION_NAMES, "activation", "whose feed-forward is relu or gelu"),
        (cfg.positions != Positions.sinusoidal, "positions", "whose positions are fairseq's sinusoids"),
        (cfg.position_offset != first_row, "position_offset", f"whose positions start at pad_id + 1 = {first_row}"),
        (not cfg.tie_embeddings, "tie_embeddings", "which has one matrix for both stacks and the output"),
        (bool(cfg.output_bias), "output_bias", "which has no bias on the logits"),
        (str(getattr(cfg.output_vocab, "value", cfg.output_vocab)) != "full", "output_vocab",
         "which has no bias to mask the logits with (trim the vocabulary at import: init_vocab=corpus)"),
        (not (cfg.cross_q_proj and cfg.cross_k_proj and cfg.cross_v_proj), "cross_q_proj", "whose cross-attention "
         "projects queries, keys and values"),
        (cfg.decoder_order != DecoderOrder.self_cross_ffn, "decoder_order", "whose decoder layers run "
         "self-attention, cross-attention, feed-forward in that order"),
    ]  # fmt: skip
    for refused, key, why in refusals:
        if refused:
            value = getattr(cfg, key)
            raise MtrainError(f"model.{key}={getattr(value, 'value', value)}: {m2m100}, {why}")


def m2m100_config(cfg: ModelConfig, tokenizer: Tokenizer) -> dict[str, Any]:
    """The `M2M100Config` arguments of a model (`cfg` as trained) with `tokenizer`'s vocabulary."""
    special = tokenizer.special_ids
    return dict(
        bart_family_config(cfg),
        vocab_size=tokenizer.src_vocab_size,
        activation_function=_ACTIVATION_NAMES[Activation(resolved_model(cfg).activation)],
        pad_token_id=special.pad,
        bos_token_id=tokenizer.piece_id(BOS_PIECE),
        eos_token_id=special.eos,
        decoder_start_token_id=special.eos,
    )


def m2m100_state_dict(state: Mapping[str, Tensor], cfg: ModelConfig, vocab_size: int) -> dict[str, Tensor]:
    """mtrain's state_dict (`cfg` as trained) renamed into M2M100ForConditionalGeneration's, fp32
    (the sinusoids are not weights there: transformers recomputes them)."""
    cfg = resolved_model(cfg)
    state = {name: tensor.detach().float().cpu() for name, tensor in state.items()}
    out = {theirs: state[ours] for theirs, ours in layer_names(cfg.encoder_layers, cfg.decoder_layers, True).items()}
    shared = state["src_embed.tokens.weight"][:vocab_size]
    for name in ("model.shared.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"):
        out[name] = shared
    out["lm_head.weight"] = shared
    return {name: tensor.contiguous() for name, tensor in out.items()}


def build_m2m100(state: Mapping[str, Tensor], cfg: ModelConfig, tokenizer: Tokenizer) -> M2M100ForConditionalGeneration:
    """A `transformers.M2M100ForConditionalGeneration` holding the weights of `state` (every
    parameter set from it: nothing keeps transformers' initialisation), in eval mode."""
    from transformers import M2M100Config, M2M100ForConditionalGeneration

    check_m2m100_exportable(cfg, tokenizer)
    model = M2M100ForConditionalGeneration(M2M100Config(**m2m100_config(cfg, tokenizer)))
    weights = m2m100_state_dict(state, cfg, tokenizer.src_vocab_size)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    missing = [name for name in missing if "embed_positions" not in name]  # recomputed buffers
    if missing or unexpected:  # (a transformers version that names its weights otherwise)
        raise MtrainError(
            f"format=hf: transformers' M2M100 has weights mtrain does not write ({missing[:3]}) or lacks "
            f"{list(unexpected)[:3]}; this transformers version is not supported"
        )
    model.tie_weights()
    model.eval()
    return model


def m2m100_generation(settings: dict[str, Any], tokenizer: Tokenizer, target_language: str | None) -> dict[str, Any]:
    """`hf_generation.generation_settings` for an M2M100 model: the decoder starts from `</s>`,
    `<s>` and pad are never emitted, and the first token is the target language's
    (`forced_bos_token_id`) when the run has one. The language tokens are not suppressed:
    transformers applies suppress_tokens after the forced token, which would ban that too."""
    bos = tokenizer.piece_id(BOS_PIECE)
    out = dict(settings, bos_token_id=bos, suppress_tokens=[tokenizer.pad_id, bos])
    if target_language is not None:
        out["forced_bos_token_id"] = tokenizer.with_languages(target_language, target_language).target_prefix[0]
    return out
