"""`build_model`: check a ModelConfig, resolve its shortcuts, construct the Transformer.

Every invalid value raises `MtrainError` naming the key, before any tensor is allocated.
Resolved here: `layers` (when set, both stacks get that many layers) and `final_norm`
(null means on with pre-norm and off with post-norm).
"""

from __future__ import annotations

from mtrain.config import ModelConfig
from mtrain.errors import MtrainError
from mtrain.model.transformer import Seq2SeqTransformer

CHOICES = {
    "activation": ("relu", "gelu", "swiglu"),
    "norm_position": ("pre", "post"),
    "residual_input": ("raw", "normalized"),
    "norm_type": ("layernorm", "rmsnorm"),
    "positions": ("sinusoidal", "learned", "rope", "none"),
    "decoder_order": ("self_cross_ffn", "cross_self_ffn", "self_ffn_cross"),
    "attention_impl": ("auto", "sdpa", "math"),
}
POSITIVE = ("encoder_layers", "decoder_layers", "d_model", "heads", "ffn_dim", "max_positions", "vocab_multiple")
PROBABILITIES = ("dropout", "attention_dropout", "activation_dropout")


def check_model_config(cfg: ModelConfig) -> None:
    """Raise MtrainError("model.<key>: ...") for the first invalid value."""
    for key, allowed in CHOICES.items():
        if getattr(cfg, key) not in allowed:
            raise MtrainError(f"model.{key}: {getattr(cfg, key)!r} is not one of {'|'.join(allowed)}")
    for key in POSITIVE + (("layers",) if cfg.layers is not None else ()):
        if getattr(cfg, key) < 1:
            raise MtrainError(f"model.{key}: {getattr(cfg, key)!r} must be a positive integer")
    for key in PROBABILITIES:
        if not 0.0 <= getattr(cfg, key) < 1.0:
            raise MtrainError(f"model.{key}: {getattr(cfg, key)!r} must be in [0, 1)")
    if cfg.residual_input == "normalized" and cfg.norm_position != "pre":
        raise MtrainError(
            "model.residual_input: normalized needs model.norm_position=pre (post-norm's stream is "
            "normalised after every sublayer already)"
        )
    if cfg.d_model % cfg.heads:
        raise MtrainError(f"model.heads: {cfg.heads} does not divide model.d_model={cfg.d_model}")
    if cfg.positions == "rope" and (cfg.d_model // cfg.heads) % 2:
        raise MtrainError(
            f"model.positions: rope needs an even head size, got d_model/heads = {cfg.d_model // cfg.heads}"
        )


def build_model(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int, pad_id: int, *,
                joint_vocab: bool) -> Seq2SeqTransformer:
    """The Transformer for these vocabularies; `joint_vocab` (the tokenizer's `.joint`: one
    vocabulary for both languages) lets `model.tie_embeddings` tie the source embedding too."""
    check_model_config(cfg)
    if joint_vocab and src_vocab_size != tgt_vocab_size:
        raise ValueError(f"a joint vocabulary has one size, got {src_vocab_size} and {tgt_vocab_size}")
    for name, size in (("source", src_vocab_size), ("target", tgt_vocab_size)):
        if not 0 <= pad_id < size:
            raise MtrainError(f"tokenizer.pad_id: {pad_id} is outside the {name} vocabulary of {size}")
    encoder_layers = cfg.layers if cfg.layers is not None else cfg.encoder_layers
    decoder_layers = cfg.layers if cfg.layers is not None else cfg.decoder_layers
    final_norm = cfg.final_norm if cfg.final_norm is not None else cfg.norm_position == "pre"
    return Seq2SeqTransformer(cfg, src_vocab_size, tgt_vocab_size, pad_id, joint_vocab,
                              encoder_layers, decoder_layers, final_norm)
