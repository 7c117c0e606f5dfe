"""`build_model`: check a ModelConfig, resolve its shortcuts, construct the Transformer.

Every invalid value raises `MtrainError` naming the key, before any tensor is allocated
(mtrain.config.check_model_config). The derived values (`layers`, `final_norm`) are resolved by
mtrain.config.resolved_model, the one place that decides them.
"""

from __future__ import annotations

from mtrain.config import ModelConfig, check_model_config, resolved_model
from mtrain.errors import MtrainError
from mtrain.model.transformer import Seq2SeqTransformer


def build_model(
    cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int, pad_id: int, *, joint_vocab: bool
) -> Seq2SeqTransformer:
    """The Transformer for these vocabularies; `joint_vocab` (the tokenizer's `.joint`: one
    vocabulary for both languages) lets `model.tie_embeddings` tie the source embedding too."""
    check_model_config(cfg)
    if joint_vocab and src_vocab_size != tgt_vocab_size:
        raise ValueError(f"a joint vocabulary has one size, got {src_vocab_size} and {tgt_vocab_size}")
    for name, size in (("source", src_vocab_size), ("target", tgt_vocab_size)):
        if not 0 <= pad_id < size:
            raise MtrainError(f"tokenizer.pad_id: {pad_id} is outside the {name} vocabulary of {size}")
    cfg = resolved_model(cfg)
    assert cfg.final_norm is not None  # resolved_model decides null (auto)
    return Seq2SeqTransformer(
        cfg, src_vocab_size, tgt_vocab_size, pad_id, joint_vocab, cfg.encoder_layers, cfg.decoder_layers, cfg.final_norm
    )
