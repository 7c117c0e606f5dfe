"""mtrain's Transformer as a CTranslate2 `TransformerSpec`, built from a state_dict.

Every switch of `ModelConfig` is mapped here, or refused with an MtrainError naming it:

    model key                  CTranslate2 spec
    norm_position pre|post     pre_norm (post-norm with a final norm: the final norm is kept)
    norm_type rmsnorm          rms_norm; `layer_norm_epsilon` = the eps mtrain's norm uses
    final_norm                 encoder/decoder `layer_norm` present or not
    shared_norm                the one shared norm copied into every sublayer (same function)
    activation relu|gelu|silu  activation RELU | GELU (erf, as torch's default) | SWISH
    activation swiglu          ffn_glu with SWISH: linear_0 = gate (activated), linear_0_noact = up
    positions sinusoidal(_marian)  the table mtrain computes, stored as `position_encodings`
    position_offset            the table's rows from that one on (M2M100/NLLB: pad_id + 1)
    positions learned          the trained table
    positions none             an all-zero table (adds nothing, as in mtrain)
    positions rope             rotary on every self-attention, whole head, rotate-half layout
    scale_embeddings           scale_embeddings sqrt(d_model) or 1
    tie_embeddings             tied matrices are copied (CTranslate2 aliases equal weights)
    cross_{q,k,v}_proj=false   an identity matrix with a zero bias (exact in fp32)
    decoder_order              only self_cross_ffn: CTranslate2's decoder layer has that order
    vocab_multiple             padded rows are cut: the exported vocabulary is the real one,
                               so a padded id can never be produced
    output_bias                the output projection's bias
    output_vocab target        the output projection gets a bias: 0 (or output_bias's) on the
                               allowed rows, -1e9 (probability 0) on the others, so neither
                               engine emits them

Settings that do not exist at inference (dropout, detach_memory, attention_impl) are ignored.
A ModelConfig key this module does not know, set to a non-default value, is refused: a new
model switch must be mapped here before its models export.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

import numpy as np
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
from mtrain.model.positions import position_table

# ModelConfig keys that have no effect on inference, and those mapped by `build_spec`.
INFERENCE_IRRELEVANT = {"dropout", "attention_dropout", "activation_dropout", "detach_memory", "attention_impl"}
MAPPED = {
    "encoder_layers",
    "decoder_layers",
    "layers",
    "d_model",
    "heads",
    "ffn_dim",
    "activation",
    "norm_position",
    "norm_type",
    "shared_norm",
    "final_norm",
    "positions",
    "max_positions",
    "position_offset",
    "cross_q_proj",
    "cross_k_proj",
    "cross_v_proj",
    "decoder_order",
    "scale_embeddings",
    "tie_embeddings",
    "vocab_multiple",
    "output_vocab",
    "output_bias",
}
# torch's defaults, which mtrain's norms use (mtrain.model.layers.make_norm).
NORM_EPSILON = {NormType.layernorm: 1e-5, NormType.rmsnorm: 1e-6}


def check_exportable(cfg: ModelConfig) -> None:
    """Raise MtrainError naming the first model setting CTranslate2 cannot represent.

    `cfg`: the run's model config (a ModelConfig, or its OmegaConf node).
    """
    defaults = {field.name: field.default for field in fields(ModelConfig)}
    settings = to_plain(cfg)
    if settings.get("term_factors"):
        raise MtrainError(
            "model.term_factors=true: CTranslate2 (and Argos, which runs it) reads no source factors, where this "
            "term-aware model reads its terms; translate and serve it with mtrain's own engine (engine=torch)"
        )
    for name, value in settings.items():
        if name in MAPPED or name in INFERENCE_IRRELEVANT:
            continue
        if name not in defaults or value != defaults[name]:
            raise MtrainError(
                f"model.{name}={value!r}: the CTranslate2 converter does not know this setting; "
                "only models that leave it at its default can be exported"
            )
    if cfg.decoder_order != DecoderOrder.self_cross_ffn:
        raise MtrainError(
            f"model.decoder_order={cfg.decoder_order}: CTranslate2's decoder layer runs self-attention, "
            "cross-attention, feed-forward in that order; only models trained with "
            "model.decoder_order=self_cross_ffn can be exported"
        )


def build_spec(
    state: Mapping[str, Tensor],
    cfg: ModelConfig,
    src_vocabulary: Sequence[str],
    tgt_vocabulary: Sequence[str],
    special_pieces: Mapping[str, str],
) -> Any:  # ctranslate2's specs (and every `spec` below) are untyped
    """A validated `ctranslate2.specs.TransformerSpec` holding the weights of `state`.

    `state` is the model's state_dict, `cfg` its ModelConfig (as trained). The vocabularies
    are the SentencePiece pieces in id order; `special_pieces` maps unk/bos/eos to their pieces.
    """
    from ctranslate2.specs import common_spec, transformer_spec

    check_exportable(cfg)
    state = {name: tensor.detach().float().cpu() for name, tensor in state.items()}
    cfg = resolved_model(cfg)
    encoder_layers, decoder_layers, final_norm = cfg.encoder_layers, cfg.decoder_layers, cfg.final_norm
    pre_norm = cfg.norm_position == NormPosition.pre
    gated = Activation(cfg.activation).gated
    activation = {
        Activation.relu: common_spec.Activation.RELU,
        Activation.gelu: common_spec.Activation.GELU,
        Activation.silu: common_spec.Activation.SWISH,
        Activation.swiglu: common_spec.Activation.SWISH,
    }[cfg.activation]
    common = dict(
        # The spec creates the final norm only for pre-norm; post-norm is switched on below.
        pre_norm=True,
        no_final_norm=not final_norm,
        activation=activation,
        ffn_glu=gated,
        rms_norm=cfg.norm_type == NormType.rmsnorm,
    )
    if cfg.positions == Positions.rope:
        common.update(rotary_dim=0, rotary_interleave=False, rotary_base=10000.0)
    encoder = transformer_spec.TransformerEncoderSpec(encoder_layers, cfg.heads, **common)
    decoder = transformer_spec.TransformerDecoderSpec(
        decoder_layers,
        cfg.heads,
        alignment_layer=-1,
        alignment_heads=0,
        **common,  # 0: average all heads
    )
    encoder.pre_norm = decoder.pre_norm = pre_norm

    embedding_scale = math.sqrt(cfg.d_model) if cfg.scale_embeddings else 1.0
    _set_embeddings(encoder, state["src_embed.tokens.weight"][: len(src_vocabulary)], embedding_scale)
    _set_embeddings(decoder, state["tgt_embed.tokens.weight"][: len(tgt_vocabulary)], embedding_scale)
    if cfg.positions != Positions.rope:
        encoder.position_encodings.encodings = _position_table(state, "src_embed", cfg)
        decoder.position_encodings.encodings = _position_table(state, "tgt_embed", cfg)
    decoder.projection.weight = _numpy(state["output_proj.weight"][: len(tgt_vocabulary)])
    if "output_proj.bias" in state:  # model.output_bias
        decoder.projection.bias = _numpy(state["output_proj.bias"][: len(tgt_vocabulary)])
    if "output_allowed" in state:
        allowed = state["output_allowed"][: len(tgt_vocabulary)].bool().numpy()
        bias = decoder.projection.bias if "output_proj.bias" in state else 0.0
        decoder.projection.bias = np.where(allowed, bias, -1e9).astype(decoder.projection.weight.dtype)
    if final_norm:
        _set_norm(encoder.layer_norm, state, "encoder_norm")
        _set_norm(decoder.layer_norm, state, "decoder_norm")

    for index, layer in enumerate(encoder.layer):
        prefix = f"encoder.{index}"
        _set_self_attention(layer.self_attention, state, prefix)
        _set_ffn(layer.ffn, state, prefix, gated)
    for index, layer in enumerate(decoder.layer):
        prefix = f"decoder.{index}"
        _set_self_attention(layer.self_attention, state, prefix)
        _set_cross_attention(layer.attention, state, prefix, cfg.d_model)
        _set_ffn(layer.ffn, state, prefix, gated)

    spec = transformer_spec.TransformerSpec(encoder, decoder)
    spec.config.layer_norm_epsilon = NORM_EPSILON[cfg.norm_type]
    spec.config.unk_token = special_pieces["unk"]
    spec.config.bos_token = special_pieces["bos"]
    spec.config.eos_token = special_pieces["eos"]
    spec.config.decoder_start_token = special_pieces["bos"]
    spec.register_source_vocabulary(list(src_vocabulary))
    spec.register_target_vocabulary(list(tgt_vocabulary))
    spec.validate()
    return spec


def _numpy(tensor: Tensor) -> np.ndarray:
    return tensor.contiguous().numpy()


def _set_embeddings(stack: Any, weight: Tensor, scale: float) -> None:
    embeddings = stack.embeddings[0] if isinstance(stack.embeddings, list) else stack.embeddings
    embeddings.weight = _numpy(weight)
    stack.scale_embeddings = np.float32(scale)


def _position_table(state: Mapping[str, Tensor], embed: str, cfg: ModelConfig) -> np.ndarray:
    """(max_positions, d_model): what mtrain adds at positions 0, 1, ... (the first token is 0)."""
    if cfg.positions == Positions.learned:
        return _numpy(state[f"{embed}.positions.weight"])
    if cfg.positions in (Positions.sinusoidal, Positions.sinusoidal_marian):
        first = int(cfg.position_offset)  # (mtrain.model.positions.SinusoidalPositions' first_row)
        return _numpy(position_table(cfg.positions, first + cfg.max_positions, cfg.d_model)[first:])
    return np.zeros((cfg.max_positions, cfg.d_model), dtype=np.float32)  # positions=none


def _set_norm(spec: Any, state: Mapping[str, Tensor], prefix: str) -> None:
    spec.gamma = _numpy(state[f"{prefix}.weight"])
    if hasattr(spec, "beta"):  # layernorm (rmsnorm has no bias)
        spec.beta = _numpy(state[f"{prefix}.bias"])


def _set_linear(spec: Any, state: Mapping[str, Tensor], prefixes: Sequence[str]) -> None:
    """One Linear, or several concatenated on the output dim (fused QKV / KV)."""
    spec.weight = _numpy(torch.cat([state[f"{p}.weight"] for p in prefixes]))
    spec.bias = _numpy(torch.cat([state[f"{p}.bias"] for p in prefixes]))


def _set_self_attention(spec: Any, state: Mapping[str, Tensor], layer: str) -> None:
    _set_norm(spec.layer_norm, state, f"{layer}.self_attn_norm")
    attention = f"{layer}.self_attn"
    _set_linear(spec.linear[0], state, [f"{attention}.q_proj", f"{attention}.k_proj", f"{attention}.v_proj"])
    _set_linear(spec.linear[1], state, [f"{attention}.out_proj"])


def _set_cross_attention(spec: Any, state: Mapping[str, Tensor], layer: str, d_model: int) -> None:
    _set_norm(spec.layer_norm, state, f"{layer}.cross_attn_norm")
    attention = f"{layer}.cross_attn"

    def projection(name: str) -> tuple[Tensor, Tensor]:
        if f"{attention}.{name}.weight" in state:
            return state[f"{attention}.{name}.weight"], state[f"{attention}.{name}.bias"]
        return torch.eye(d_model), torch.zeros(d_model)  # model.cross_{name}=false: the identity

    q_weight, q_bias = projection("q_proj")
    k_weight, k_bias = projection("k_proj")
    v_weight, v_bias = projection("v_proj")
    spec.linear[0].weight, spec.linear[0].bias = _numpy(q_weight), _numpy(q_bias)
    spec.linear[1].weight = _numpy(torch.cat([k_weight, v_weight]))
    spec.linear[1].bias = _numpy(torch.cat([k_bias, v_bias]))
    _set_linear(spec.linear[2], state, [f"{attention}.out_proj"])


def _set_ffn(spec: Any, state: Mapping[str, Tensor], layer: str, glu: bool) -> None:
    _set_norm(spec.layer_norm, state, f"{layer}.ffn_norm")
    ffn = f"{layer}.ffn"
    if glu:
        _set_linear(spec.linear_0, state, [f"{ffn}.gate"])  # activated (silu)
        _set_linear(spec.linear_0_noact, state, [f"{ffn}.up"])
    else:
        _set_linear(spec.linear_0, state, [f"{ffn}.up"])
    _set_linear(spec.linear_1, state, [f"{ffn}.down"])
