"""M2M100ForConditionalGeneration's weights (M2M100, NLLB-200) as mtrain's model's state dict.

M2M100 is the Transformer mtrain builds by default: pre-LN layers with a LayerNorm per sublayer
and one after each stack (`norm_position=pre`, `final_norm`), ReLU, biases everywhere, fairseq's
sinusoids (`positions=sinusoidal`) numbered from pad_id + 1 (`position_offset`), embeddings
scaled by sqrt(d_model), and one matrix for the source and target embeddings and the output
layer (`tie_embeddings`, a joint vocabulary). Its layers are named as the BART family names
them (mtrain.checkpoint.hf_weights' table, the final norms included); the sinusoids are not saved.

config.json's vocab_size may exceed the tokenizer's pieces (NLLB-200's 256,206 rows against
256,204 pieces): rows no piece numbers are never looked up and their logits are never chosen
in practice, so they are left out here (mtrain's output layer has no row for them).
"""

from __future__ import annotations

import torch
from torch import Tensor

from mtrain.checkpoint.hf_weights import embedding, layer_names, layer_shape, padded
from mtrain.config import ModelConfig
from mtrain.errors import MtrainError
from mtrain.model.embeddings import padded_rows
from mtrain.tokenizer import Tokenizer

M2M100 = "M2M100ForConditionalGeneration"
POSITION_TABLES = ("model.encoder.embed_positions.weights", "model.decoder.embed_positions.weights")


def m2m100_state(
    weights: dict[str, Tensor], model: ModelConfig, tokenizer: Tokenizer, vocab_rows: int, source: str
) -> dict[str, Tensor]:
    """mtrain's state dict from M2M100's `weights` (`vocab_rows`: config.json's vocab_size)."""
    for name in POSITION_TABLES:  # a file that saved the sinusoids: recomputed from the config
        weights.pop(name, None)
    names = layer_names(model.encoder_layers, model.decoder_layers, final_norms=True)
    missing = [name for name in names if name not in weights]
    shared = embedding(weights, "source")
    if shared is None:
        missing.append("model.shared.weight")
    if missing:
        raise MtrainError(
            f"{source}: the weights lack {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}; "
            "they do not fit config.json"
        )
    assert shared is not None  # (checked above)
    state = {}
    for theirs, ours in names.items():
        expected = layer_shape(ours, model.d_model, model.ffn_dim)
        if tuple(weights[theirs].shape) != expected:
            raise MtrainError(
                f"{source}: {theirs} is {tuple(weights[theirs].shape)}, but config.json's d_model={model.d_model} "
                f"and ffn_dim={model.ffn_dim} make it {expected}; the weights do not belong to this config.json"
            )
        state[ours] = weights[theirs]
    for which in ("target", "output"):  # tied: save_pretrained keeps one; another must be the same
        other = embedding(weights, which)
        if other is not None and other is not shared and not torch.equal(other, shared):
            raise MtrainError(
                f"{source}: the {which} embedding differs from model.shared.weight, but config.json ties them "
                "(tie_word_embeddings); mtrain's model holds one matrix"
            )
    pieces = tokenizer.src_vocab_size
    if tuple(shared.shape) != (vocab_rows, model.d_model):
        raise MtrainError(
            f"{source}: model.shared.weight is {tuple(shared.shape)}, but config.json's vocab_size x d_model is "
            f"{(vocab_rows, model.d_model)}; the weights do not belong to this config.json"
        )
    matrix = padded(shared[:pieces], padded_rows(pieces, model.vocab_multiple))
    for ours in ("src_embed.tokens.weight", "tgt_embed.tokens.weight", "output_proj.weight"):
        state[ours] = matrix
    return state
