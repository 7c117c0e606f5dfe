"""mtrain's Transformer as transformers' `PegasusForConditionalGeneration`, from a state_dict.

Why Pegasus. Of the encoder-decoders `transformers` ships, it is the one whose forward pass is
mtrain's default model operation for operation, with no convention to bridge:
- Pre-LN layers, x + Sublayer(LayerNorm(x)), in mtrain's order (self-attention,
  cross-attention, feed-forward), a final LayerNorm after each stack, and nothing after the
  embeddings (mBART adds a LayerNorm there; MarianMT and FSMT are post-norm);
- token embeddings times sqrt(d_model) (`scale_embedding`) plus a position table that is a
  weight of the checkpoint, loaded as saved and indexed from 0 in both stacks, as mtrain's is.
  M2M100, also pre-LN and sinusoidal, recomputes its sinusoids and numbers positions from
  pad_token_id + 1: mtrain's models would need another position numbering to match it;
- q/k/v/out projections and fc1/fc2 with biases, an output layer without bias, plus a
  `final_logits_bias` buffer added to the logits (which carries `model.output_vocab=target`);
- one embedding matrix for both stacks and the output layer (`tie_word_embeddings`), or three.

Every switch of `ModelConfig` is mapped here, or refused with an MtrainError naming it:

    model key                  Pegasus
    norm_position pre          its layers (post: refused)
    norm_type layernorm        nn.LayerNorm, eps 1e-5 in both (rmsnorm: refused)
    final_norm                 each stack's `layer_norm` (false: refused; Pegasus always has one)
    shared_norm                the shared norm copied into each sublayer's
    activation relu|gelu|silu  activation_function relu | gelu (erf in both) | silu (swiglu: refused)
    positions sinusoidal(_marian)  mtrain's table (sines, then cosines) as `embed_positions.weight`
    position_offset            that table's rows from that one on
    positions learned          the trained tables (frozen weights in transformers)
    positions none             an all-zero table
    positions rope             refused: Pegasus adds positions to the embeddings
    max_positions              max_position_embeddings (the tables' rows)
    scale_embeddings           scale_embedding
    tie_embeddings             tie_word_embeddings; untied: encoder, decoder and output matrices
    cross_{q,k,v}_proj=false   an identity matrix with a zero bias (exact in fp32)
    decoder_order              self_cross_ffn only
    vocab_multiple             padded rows are cut: vocab_size is the tokenizer's
    output_bias                final_logits_bias
    output_vocab target        final_logits_bias: 0 (or output_bias's) on the allowed pieces,
                               -inf on the others, before the softmax as in mtrain

The vocabulary must be joint (`tokenizer.joint`): Pegasus has one vocabulary for both sides.
Dropout rates are carried over for fine-tuning in transformers; detach_memory and
attention_impl do not exist at inference. A ModelConfig key this module does not know, set
to a non-default value, is refused: a new model switch must be mapped here before it exports.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

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
from mtrain.export.ctranslate2_spec import INFERENCE_IRRELEVANT, MAPPED  # the same keys decide both exports
from mtrain.model.positions import position_table

if TYPE_CHECKING:  # an optional dependency, imported when an export runs
    from transformers import PegasusForConditionalGeneration

ARCHITECTURE = "PegasusForConditionalGeneration"


def check_hf_exportable(cfg: ModelConfig, joint_vocab: bool) -> None:
    """Raise MtrainError naming the first setting transformers' Pegasus cannot represent.

    `cfg`: the run's model config (a ModelConfig, or its OmegaConf node); `joint_vocab`: the
    run's tokenizer has one vocabulary for both languages.
    """
    defaults = {field.name: field.default for field in fields(ModelConfig)}
    if to_plain(cfg).get("term_factors"):
        raise MtrainError(
            "model.term_factors=true: transformers' Pegasus reads no source factors, where this term-aware "
            "model reads its terms; translate and serve it with mtrain itself"
        )
    for name, value in to_plain(cfg).items():
        if name in MAPPED or name in INFERENCE_IRRELEVANT:
            continue
        if name not in defaults or value != defaults[name]:
            raise MtrainError(
                f"model.{name}={value!r}: format=hf does not know this setting; only models that leave "
                "it at its default can be exported to transformers"
            )
    resolved = resolved_model(cfg)
    pegasus = "format=hf writes transformers' Pegasus architecture"
    refusals = [
        (resolved.norm_position != NormPosition.pre, "norm_position", "whose layers are pre-norm"),
        (resolved.norm_type != NormType.layernorm, "norm_type", "whose norms are LayerNorm"),
        (not resolved.final_norm, "final_norm", "which ends each stack with a LayerNorm"),
        (Activation(resolved.activation).gated, "activation", "whose feed-forward has two matrices"),
        (resolved.positions == Positions.rope, "positions", "which adds positions to the embeddings"),
        (resolved.decoder_order != DecoderOrder.self_cross_ffn, "decoder_order", "whose decoder layers run "
         "self-attention, cross-attention, feed-forward in that order"),
    ]  # fmt: skip
    for refused, key, why in refusals:
        if refused:
            raise MtrainError(
                f"model.{key}={to_plain(cfg)[key]}: {pegasus}, {why}; this run exports with format=ctranslate2"
            )
    if not joint_vocab:
        raise MtrainError(
            f"tokenizer.joint=false: {pegasus}, which has one vocabulary for source and target; "
            "this run exports with format=ctranslate2"
        )


def bart_family_config(cfg: ModelConfig) -> dict[str, Any]:
    """The arguments transformers' BART-family configs (Pegasus, Marian) name alike: the stacks'
    sizes, positions, embedding scale, tying, dropouts; no layer drop, no forced EOS."""
    cfg = resolved_model(cfg)
    return dict(
        d_model=cfg.d_model,
        encoder_layers=cfg.encoder_layers,
        decoder_layers=cfg.decoder_layers,
        encoder_attention_heads=cfg.heads,
        decoder_attention_heads=cfg.heads,
        encoder_ffn_dim=cfg.ffn_dim,
        decoder_ffn_dim=cfg.ffn_dim,
        max_position_embeddings=cfg.max_positions,
        scale_embedding=bool(cfg.scale_embeddings),
        tie_word_embeddings=bool(cfg.tie_embeddings),
        dropout=float(cfg.dropout),
        attention_dropout=float(cfg.attention_dropout),
        activation_dropout=float(cfg.activation_dropout),
        encoder_layerdrop=0.0,
        decoder_layerdrop=0.0,
        forced_eos_token_id=None,
    )


def pegasus_config(cfg: ModelConfig, vocab_size: int, pad_id: int, bos_id: int, eos_id: int) -> dict[str, Any]:
    """The `PegasusConfig` arguments of a model (`cfg` as trained) with these special ids.
    The decoder starts from bos, as mtrain's does; nothing is forced at the end."""
    return dict(
        bart_family_config(cfg),
        vocab_size=vocab_size,
        activation_function=str(Activation(resolved_model(cfg).activation).value),
        pad_token_id=pad_id,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        decoder_start_token_id=bos_id,
    )


def pegasus_state_dict(state: Mapping[str, Tensor], cfg: ModelConfig, vocab_size: int) -> dict[str, Tensor]:
    """mtrain's state_dict (`cfg` as trained) renamed and reshaped into Pegasus's, fp32."""
    cfg = resolved_model(cfg)
    state = {name: tensor.detach().float().cpu() for name, tensor in state.items()}
    out = {
        "model.shared.weight": state["src_embed.tokens.weight"][:vocab_size],
        "model.encoder.embed_tokens.weight": state["src_embed.tokens.weight"][:vocab_size],
        "model.decoder.embed_tokens.weight": state["tgt_embed.tokens.weight"][:vocab_size],
        "lm_head.weight": state["output_proj.weight"][:vocab_size],
        "final_logits_bias": state["output_proj.bias"][None, :vocab_size]
        if "output_proj.bias" in state
        else torch.zeros(1, vocab_size),
        "model.encoder.embed_positions.weight": _position_table(state, "src_embed", cfg),
        "model.decoder.embed_positions.weight": _position_table(state, "tgt_embed", cfg),
    }
    if "output_allowed" in state:  # model.output_vocab=target
        allowed = state["output_allowed"][:vocab_size].bool()
        out["final_logits_bias"] = torch.where(allowed, out["final_logits_bias"][0], float("-inf"))[None, :]
    for stack, norm in (("encoder", "encoder_norm"), ("decoder", "decoder_norm")):
        _copy(out, f"model.{stack}.layer_norm", state, norm)
    for index in range(cfg.encoder_layers):
        ours, theirs = f"encoder.{index}", f"model.encoder.layers.{index}"
        _copy_attention(out, f"{theirs}.self_attn", state, f"{ours}.self_attn", cfg.d_model)
        _copy(out, f"{theirs}.self_attn_layer_norm", state, f"{ours}.self_attn_norm")
        _copy_ffn(out, theirs, state, ours)
    for index in range(cfg.decoder_layers):
        ours, theirs = f"decoder.{index}", f"model.decoder.layers.{index}"
        _copy_attention(out, f"{theirs}.self_attn", state, f"{ours}.self_attn", cfg.d_model)
        _copy(out, f"{theirs}.self_attn_layer_norm", state, f"{ours}.self_attn_norm")
        _copy_attention(out, f"{theirs}.encoder_attn", state, f"{ours}.cross_attn", cfg.d_model)
        _copy(out, f"{theirs}.encoder_attn_layer_norm", state, f"{ours}.cross_attn_norm")
        _copy_ffn(out, theirs, state, ours)
    return {name: tensor.contiguous() for name, tensor in out.items()}


def build_pegasus(
    state: Mapping[str, Tensor], cfg: ModelConfig, vocab_size: int, pad_id: int, bos_id: int, eos_id: int
) -> PegasusForConditionalGeneration:
    """A `transformers.PegasusForConditionalGeneration` holding the weights of `state`, in eval mode.

    Every one of its parameters and buffers is set from `state` (a strict load): none keeps
    transformers' initialisation.
    """
    from transformers import PegasusConfig, PegasusForConditionalGeneration

    model = PegasusForConditionalGeneration(PegasusConfig(**pegasus_config(cfg, vocab_size, pad_id, bos_id, eos_id)))
    model.load_state_dict(pegasus_state_dict(state, cfg, vocab_size), strict=True)
    model.eval()
    return model


def _position_table(state: Mapping[str, Tensor], embed: str, cfg: ModelConfig) -> Tensor:
    """(max_positions, d_model): what mtrain adds at positions 0, 1, ... (the first token is 0)."""
    if cfg.positions == Positions.learned:
        return state[f"{embed}.positions.weight"]
    if cfg.positions in (Positions.sinusoidal, Positions.sinusoidal_marian):
        first = int(cfg.position_offset)  # (mtrain.model.positions.SinusoidalPositions' first_row)
        return position_table(cfg.positions, first + cfg.max_positions, cfg.d_model)[first:]
    return torch.zeros(cfg.max_positions, cfg.d_model)  # positions=none


def _copy(out: dict[str, Tensor], theirs: str, state: Mapping[str, Tensor], ours: str) -> None:
    """A Linear or LayerNorm: weight and bias."""
    out[f"{theirs}.weight"] = state[f"{ours}.weight"]
    out[f"{theirs}.bias"] = state[f"{ours}.bias"]


def _copy_attention(out: dict[str, Tensor], theirs: str, state: Mapping[str, Tensor], ours: str, d_model: int) -> None:
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        if f"{ours}.{name}.weight" in state:
            _copy(out, f"{theirs}.{name}", state, f"{ours}.{name}")
        else:  # model.cross_{name}=false: the identity
            out[f"{theirs}.{name}.weight"] = torch.eye(d_model)
            out[f"{theirs}.{name}.bias"] = torch.zeros(d_model)


def _copy_ffn(out: dict[str, Tensor], theirs: str, state: Mapping[str, Tensor], ours: str) -> None:
    _copy(out, f"{theirs}.fc1", state, f"{ours}.ffn.up")
    _copy(out, f"{theirs}.fc2", state, f"{ours}.ffn.down")
    _copy(out, f"{theirs}.final_layer_norm", state, f"{ours}.ffn_norm")
