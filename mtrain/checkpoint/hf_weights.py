"""The names of transformers' encoder-decoder weights in mtrain's model, both ways.

MarianMTModel and PegasusForConditionalGeneration (the BART family) name a layer's weights
alike, and mtrain's layers hold the same matrices (q/k/v/out projections with biases, fc1 and
fc2, one LayerNorm per sublayer), so one table serves the import (`init_from=` a Hugging Face
directory: mtrain.train.hf_parent) and the export (`mtrain export format=hf`: mtrain.export.hf_marian):

    transformers                                  mtrain
    model.{encoder,decoder}.layers.N.self_attn.*  {encoder,decoder}.N.self_attn.*
    ...self_attn_layer_norm                       ...self_attn_norm
    model.decoder.layers.N.encoder_attn.*         decoder.N.cross_attn.*
    ...encoder_attn_layer_norm                    ...cross_attn_norm
    ...fc1, fc2, final_layer_norm                 ...ffn.up, ffn.down, ffn_norm
    model.{encoder,decoder}.layer_norm            encoder_norm, decoder_norm   (Pegasus: pre-LN)
    model.shared / encoder.embed_tokens           src_embed.tokens             (rows padded to
    model.decoder.embed_tokens                    tgt_embed.tokens              model.vocab_multiple)
    lm_head                                       output_proj.weight
    final_logits_bias (1, vocab)                  output_proj.bias             (model.output_bias)

A tied matrix is stored once by `save_pretrained` (under `model.shared.weight`, or the
decoder's embedding): `embedding` finds it under whichever name holds it.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

_SUBLAYERS = {
    "self_attn.q_proj": "self_attn.q_proj",
    "self_attn.k_proj": "self_attn.k_proj",
    "self_attn.v_proj": "self_attn.v_proj",
    "self_attn.out_proj": "self_attn.out_proj",
    "self_attn_layer_norm": "self_attn_norm",
    "fc1": "ffn.up",
    "fc2": "ffn.down",
    "final_layer_norm": "ffn_norm",
}
_CROSS = {
    "encoder_attn.q_proj": "cross_attn.q_proj",
    "encoder_attn.k_proj": "cross_attn.k_proj",
    "encoder_attn.v_proj": "cross_attn.v_proj",
    "encoder_attn.out_proj": "cross_attn.out_proj",
    "encoder_attn_layer_norm": "cross_attn_norm",
}
# Where a tied matrix may be stored, first name first (save_pretrained keeps one of them).
_EMBEDDING_NAMES = {
    "source": ("model.encoder.embed_tokens.weight", "model.shared.weight"),
    "target": ("model.decoder.embed_tokens.weight", "model.shared.weight", "lm_head.weight"),
    "output": ("lm_head.weight", "model.decoder.embed_tokens.weight", "model.shared.weight"),
}


def layer_names(encoder_layers: int, decoder_layers: int, final_norms: bool) -> dict[str, str]:
    """transformers' name -> mtrain's, for every Linear and LayerNorm (weight and bias)."""
    names: dict[str, str] = {}
    for stack, count in (("encoder", encoder_layers), ("decoder", decoder_layers)):
        sublayers = {**_SUBLAYERS, **(_CROSS if stack == "decoder" else {})}
        for index in range(count):
            for theirs, ours in sublayers.items():
                for part in ("weight", "bias"):
                    names[f"model.{stack}.layers.{index}.{theirs}.{part}"] = f"{stack}.{index}.{ours}.{part}"
        if final_norms:
            for part in ("weight", "bias"):
                names[f"model.{stack}.layer_norm.{part}"] = f"{stack}_norm.{part}"
    return names


def layer_shape(ours: str, d_model: int, ffn_dim: int) -> tuple[int, ...]:
    """The shape of one of `layer_names`' weights, by mtrain's name: every matrix is
    (d_model, d_model) but the feed-forward's, every bias and norm d_model but fc1's bias."""
    if ours.endswith("ffn.up.weight"):
        return (ffn_dim, d_model)
    if ours.endswith("ffn.down.weight"):
        return (d_model, ffn_dim)
    if ours.endswith("ffn.up.bias"):
        return (ffn_dim,)
    if ours.endswith("_proj.weight"):
        return (d_model, d_model)
    return (d_model,)  # biases and norms


def embedding(weights: Mapping[str, Tensor], which: str) -> Tensor | None:
    """The source, target or output matrix (`which`), under whichever name it was saved; None
    when none of its names is there."""
    for name in _EMBEDDING_NAMES[which]:
        if name in weights:
            return weights[name]
    return None


def padded(tensor: Tensor, rows: int) -> Tensor:
    """`tensor` with zero rows appended up to `rows` (mtrain pads the vocabulary's rows)."""
    if tensor.shape[0] >= rows:
        return tensor
    return torch.cat([tensor, tensor.new_zeros((rows - tensor.shape[0], *tensor.shape[1:]))])


def without_prefix(weights: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """A bare MarianModel/PegasusModel's names (`encoder.…`) as the generation model's (`model.encoder.…`)."""
    out = {}
    for name, tensor in weights.items():
        if name.startswith(("encoder.", "decoder.", "shared.")):
            name = f"model.{name}"
        out[name] = tensor
    return out
