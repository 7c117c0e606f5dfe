"""`model:` (configs/model/): the Transformer's shape and its ablation variants; `resolved_model`
decides the derived values and `check_model_config` checks a model built in code."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum
from typing import Any

from omegaconf import OmegaConf

from mtrain.config.choice import Choice
from mtrain.config.convert import to_typed
from mtrain.config_fields import check_section, ranged
from mtrain.errors import MtrainError


class Activation(Choice):
    relu = "relu"
    gelu = "gelu"
    silu = "silu"  # x * sigmoid(x), Marian's "swish" (OPUS-MT models)
    swiglu = "swiglu"

    @property
    def gated(self) -> bool:
        """A gated linear unit: a third matrix whose activation multiplies the up projection."""
        return self is Activation.swiglu


class NormPosition(Choice):
    pre = "pre"
    post = "post"


class ResidualInput(Choice):
    raw = "raw"
    normalized = "normalized"


class NormType(Choice):
    layernorm = "layernorm"
    rmsnorm = "rmsnorm"


class OutputVocab(Choice):
    full = "full"
    target = "target"


class Positions(Choice):
    sinusoidal = "sinusoidal"
    # Sinusoids at frequencies 10000^(-2i/d_model) (Marian's and transformers' layout, OPUS-MT
    # models) instead of fairseq's 10000^(-i/(d_model/2 - 1)); sines, then cosines, in both.
    sinusoidal_marian = "sinusoidal_marian"
    learned = "learned"
    rope = "rope"
    none = "none"


class DecoderOrder(Choice):
    self_cross_ffn = "self_cross_ffn"
    cross_self_ffn = "cross_self_ffn"
    self_ffn_cross = "self_ffn_cross"

    @property
    def sublayers(self) -> tuple[str, ...]:
        """The decoder layer's sublayers in the order they run, e.g. ("cross", "self", "ffn")."""
        return tuple(self.value.split("_"))


class AttentionImpl(Choice):
    auto = "auto"
    sdpa = "sdpa"
    math = "math"


@dataclass
class ModelConfig:
    encoder_layers: int = ranged(3, at_least=1)
    decoder_layers: int = ranged(3, at_least=1)
    layers: int | None = ranged(None, at_least=1)  # sets both stacks when given (handy for sweeps)
    d_model: int = ranged(256, at_least=1)
    heads: int = ranged(4, at_least=1)
    ffn_dim: int = ranged(1024, at_least=1)
    activation: Activation = Activation.relu
    dropout: float = ranged(0.1, at_least=0, below=1)  # residual and embedding dropout
    attention_dropout: float = ranged(0.0, at_least=0, below=1)
    activation_dropout: float = ranged(0.0, at_least=0, below=1)
    norm_position: NormPosition = NormPosition.pre
    # What the pre-norm residual adds the sublayer's output to: the un-normalised stream x
    # (the standard: x + F(Norm(x))) or the normalised one (Norm(x) + F(Norm(x)); ablation).
    residual_input: ResidualInput = ResidualInput.raw
    norm_type: NormType = NormType.layernorm
    shared_norm: bool = False  # one norm shared by all sublayers of a layer (ablation)
    # A norm after the last layer of each stack; null: on with pre-norm, off with post-norm
    # (there the last sublayer already ends in a norm).
    final_norm: bool | None = None
    positions: Positions = Positions.sinusoidal
    max_positions: int = ranged(1024, at_least=1)
    # The first token's row of a sinusoidal table: M2M100/NLLB number positions from
    # pad_id + 1 (fairseq's make_positions), so an imported model reads rows 2, 3, ...
    position_offset: int = ranged(0, at_least=0)
    # Learned W_Q/W_K/W_V in cross-attention; false replaces one with the identity.
    cross_q_proj: bool = True
    cross_k_proj: bool = True
    cross_v_proj: bool = True
    detach_memory: bool = False  # stop gradients from reaching the encoder (ablation)
    decoder_order: DecoderOrder = DecoderOrder.self_cross_ffn
    scale_embeddings: bool = True  # multiply token embeddings by sqrt(d_model)
    tie_embeddings: bool = True  # source, target and output share one matrix (joint vocab)
    vocab_multiple: int = ranged(8, at_least=1)  # pad the vocabulary rows to a multiple (tensor-core shapes)
    output_bias: bool = False  # a trained bias added to the output logits (Marian's final_logits_bias)
    # Which pieces the output softmax ranges over. full: the whole target vocabulary. target:
    # the pieces that occur in the training targets (and eos, unk), fixed when training starts
    # and stored with the model: with a joint vocabulary about half the rows are source-only
    # pieces the decoder is never trained to emit (Multi30k de-en: 3,958 of 8,000), so the
    # output projection, its softmax and gradients cost half (see docs/PERFORMANCE.md).
    output_vocab: OutputVocab = OutputVocab.full
    # sdpa: torch's scaled_dot_product_attention; math: explicit matmul+softmax (faster on
    # CPU for the short sentences of small corpora); auto: measured choice per device.
    attention_impl: AttentionImpl = AttentionImpl.auto
    # A term-aware model (Dinu et al. 2019): sources may carry target terms after their words, told
    # apart by a source factor (mtrain/tokenizer/term_factors.py); trained with train.term_alignment,
    # and translate/eval/serve annotate the glossary's terms so (decode.term_mode). A fine-tune of a
    # plain model may turn it on (the factor embedding starts at zero).
    term_factors: bool = False

    @property
    def decoder_depth(self) -> int:
        """The decoder's layers: `layers` when set, else `decoder_layers`."""
        return self.decoder_layers if self.layers is None else self.layers

    def check(self, prefix: str) -> None:
        if self.residual_input == ResidualInput.normalized and self.norm_position != NormPosition.pre:
            raise MtrainError(
                f"{prefix}.residual_input: normalized needs {prefix}.norm_position=pre (post-norm's stream is "
                "normalised after every sublayer already)"
            )
        if self.d_model % self.heads:
            raise MtrainError(f"{prefix}.heads: {self.heads} does not divide {prefix}.d_model={self.d_model}")
        if self.positions == Positions.rope and (self.d_model // self.heads) % 2:
            raise MtrainError(
                f"{prefix}.positions: rope needs an even head size, got d_model/heads = {self.d_model // self.heads}"
            )
        if self.position_offset and self.positions not in (Positions.sinusoidal, Positions.sinusoidal_marian):
            raise MtrainError(
                f"{prefix}.position_offset={self.position_offset} shifts a sinusoidal table; "
                f"{prefix}.positions={Positions(self.positions).value} has none (set it to 0)"
            )


def resolved_model(cfg: Any) -> ModelConfig:
    """The model as it is built, with the derived values made explicit: `layers` (when set)
    copied to both stacks, and `final_norm` null (auto) decided: on with pre-norm, off with
    post-norm (whose last sublayer already ends in a norm).

    `cfg`: a ModelConfig, or a DictConfig/dict of its keys. The input is not changed;
    resolving a resolved config changes nothing.
    """
    if not isinstance(cfg, ModelConfig):
        cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), cfg))
    assert isinstance(cfg, ModelConfig)  # to_object of a ModelConfig node builds the dataclass
    layers = cfg.layers
    final_norm = cfg.final_norm if cfg.final_norm is not None else cfg.norm_position == NormPosition.pre
    return dataclasses.replace(
        cfg,
        encoder_layers=cfg.encoder_layers if layers is None else layers,
        decoder_layers=cfg.decoder_layers if layers is None else layers,
        final_norm=final_norm,
    )


def check_model_config(cfg: Any, prefix: str = "model") -> None:
    """Raise MtrainError("model.<key>: ...") for the first invalid value of a ModelConfig (or
    its node): `build_model` checks library callers with it, before any tensor is allocated."""
    _check_choices(cfg, ModelConfig, prefix)
    check_section(to_typed(cfg) if OmegaConf.is_config(cfg) else cfg, prefix)


def _check_choices(section: Any, schema: type, prefix: str) -> None:
    """Choice fields hold one of their values. OmegaConf enforces this for a composed config;
    a dataclass built in code (a library caller, a test) is checked here."""
    import typing

    from mtrain.config_names import did_you_mean

    for name, field_type in typing.get_type_hints(schema).items():
        choice = next(
            (t for t in (field_type, *typing.get_args(field_type)) if isinstance(t, type) and issubclass(t, Enum)), None
        )
        value = getattr(section, name)
        if choice is not None and value is not None and value not in {member.value for member in choice}:
            allowed = [member.value for member in choice]
            raise MtrainError(
                f"{prefix}.{name}: {value!r} is not one of {'|'.join(allowed)}" + did_you_mean(str(value), allowed)
            )
