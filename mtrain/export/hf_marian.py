"""A run that started from a MarianMTModel, written back as one (`mtrain export format=hf`).

A run whose tokenizer is Marian's (source.spm, target.spm, vocab.json: it started from an
imported OPUS-MT model, mtrain.train.hf_parent) exports as the architecture it came from, so a
fine-tuned OPUS-MT model loads in transformers as a MarianMTModel with a MarianTokenizer:

    model key                  MarianConfig
    norm_position post         its layers (pre: refused), no final norm (final_norm=true: refused)
    norm_type layernorm        nn.LayerNorm, eps 1e-5 in both (rmsnorm, shared_norm: refused)
    activation relu|gelu|silu  activation_function relu | gelu | swish (swiglu: refused)
    positions sinusoidal_marian  its sinusoids, which transformers recomputes (others: refused)
    max_positions              max_position_embeddings
    scale_embeddings           scale_embedding
    tie_embeddings             tie_word_embeddings; a joint vocabulary shares the encoder's and
                               decoder's (share_encoder_decoder_embeddings), separate ones do not
    output_bias                final_logits_bias (false: zeros)
    output_vocab target        final_logits_bias -inf on the pieces outside it
    vocab_multiple             padded rows are cut
    cross_{q,k,v}_proj, decoder_order, residual_input   their defaults only

The tokenizer files are the run's own, byte for byte (tokenizer/ is the imported model's),
and `tokenizer_config.json` names the run's languages. The decoder starts from `<pad>`.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from mtrain.checkpoint.hf_weights import layer_names
from mtrain.config import (
    Activation,
    DecoderOrder,
    ModelConfig,
    NormPosition,
    NormType,
    Positions,
    ResidualInput,
    resolved_model,
)
from mtrain.errors import MtrainError
from mtrain.export.hf_model import bart_family_config
from mtrain.model.positions import marian_sinusoidal_table
from mtrain.tokenizer import Tokenizer
from mtrain.tokenizer.marian_vocab import SOURCE_SPM, TARGET_SPM, TARGET_VOCAB, VOCAB

if TYPE_CHECKING:  # an optional dependency, imported when an export runs
    from transformers import MarianMTModel, MarianTokenizer

ARCHITECTURE = "MarianMTModel"
_ACTIVATION_NAMES = {Activation.relu: "relu", Activation.gelu: "gelu", Activation.silu: "swish"}


def check_marian_exportable(cfg: ModelConfig) -> None:
    """Raise MtrainError naming the first setting a MarianMTModel cannot represent."""
    cfg = resolved_model(cfg)
    marian = "format=hf writes a run with Marian's tokenizer as a MarianMTModel"
    refusals = [
        (cfg.norm_position != NormPosition.post, "norm_position", "whose layers are post-norm"),
        (bool(cfg.final_norm), "final_norm", "which has no norm after a stack"),
        (cfg.norm_type != NormType.layernorm or cfg.shared_norm, "norm_type", "whose sublayers have a LayerNorm each"),
        (Activation(cfg.activation) not in _ACTIVATION_NAMES, "activation", "whose feed-forward has two matrices"),
        (cfg.positions != Positions.sinusoidal_marian, "positions", "whose positions are Marian's sinusoids"),
        (not (cfg.cross_q_proj and cfg.cross_k_proj and cfg.cross_v_proj), "cross_q_proj", "whose cross-attention "
         "projects queries, keys and values"),
        (cfg.decoder_order != DecoderOrder.self_cross_ffn, "decoder_order", "whose decoder layers run "
         "self-attention, cross-attention, feed-forward in that order"),
        (cfg.residual_input != ResidualInput.raw, "residual_input", "whose residuals add the raw stream"),
    ]  # fmt: skip
    for refused, key, why in refusals:
        if refused:
            value = getattr(cfg, key)
            raise MtrainError(f"model.{key}={getattr(value, 'value', value)}: {marian}, {why}")


def marian_config(cfg: ModelConfig, tokenizer: Tokenizer) -> dict[str, Any]:
    """The `MarianConfig` arguments of a model (`cfg` as trained) with `tokenizer`'s vocabulary."""
    special = tokenizer.special_ids
    return dict(
        bart_family_config(cfg),
        vocab_size=tokenizer.src_vocab_size,
        decoder_vocab_size=tokenizer.tgt_vocab_size,
        share_encoder_decoder_embeddings=tokenizer.joint,
        activation_function=_ACTIVATION_NAMES[Activation(resolved_model(cfg).activation)],
        pad_token_id=special.pad,
        eos_token_id=special.eos,
        decoder_start_token_id=special.pad,
    )


def marian_state_dict(state: Mapping[str, Tensor], cfg: ModelConfig, tokenizer: Tokenizer) -> dict[str, Tensor]:
    """mtrain's state_dict (`cfg` as trained) renamed into MarianMTModel's, fp32."""
    cfg = resolved_model(cfg)
    state = {name: tensor.detach().float().cpu() for name, tensor in state.items()}
    src_size, tgt_size = tokenizer.src_vocab_size, tokenizer.tgt_vocab_size
    out = {theirs: state[ours] for theirs, ours in layer_names(cfg.encoder_layers, cfg.decoder_layers, False).items()}
    source, target = state["src_embed.tokens.weight"][:src_size], state["tgt_embed.tokens.weight"][:tgt_size]
    out.update(
        {
            "model.encoder.embed_tokens.weight": source,
            "model.decoder.embed_tokens.weight": target,
            "lm_head.weight": state["output_proj.weight"][:tgt_size],
            "model.encoder.embed_positions.weight": marian_sinusoidal_table(cfg.max_positions, cfg.d_model),
            "model.decoder.embed_positions.weight": marian_sinusoidal_table(cfg.max_positions, cfg.d_model),
        }
    )
    if tokenizer.joint:
        out["model.shared.weight"] = source
    bias = state["output_proj.bias"][:tgt_size] if "output_proj.bias" in state else torch.zeros(tgt_size)
    if "output_allowed" in state:  # model.output_vocab=target
        bias = torch.where(state["output_allowed"][:tgt_size].bool(), bias, float("-inf"))
    out["final_logits_bias"] = bias[None, :]
    return {name: tensor.contiguous() for name, tensor in out.items()}


def build_marian(
    state: Mapping[str, Tensor], cfg: ModelConfig, tokenizer: Tokenizer, languages: tuple[str | None, str | None]
) -> tuple[MarianMTModel, MarianTokenizer]:
    """A `transformers.MarianMTModel` holding the weights of `state` (a strict load: nothing
    keeps transformers' initialisation), in eval mode, and its `MarianTokenizer` over the run's
    files; `languages`: (source, target) for tokenizer_config.json."""
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    check_marian_exportable(cfg)
    model = MarianMTModel(MarianConfig(**marian_config(cfg, tokenizer)))
    model.load_state_dict(marian_state_dict(state, cfg, tokenizer), strict=True)
    model.eval()
    files = tokenizer.files
    with warnings.catch_warnings():  # "Recommended: pip install sacremoses": its normaliser is never called
        warnings.simplefilter("ignore")
        hf_tokenizer = MarianTokenizer(
            str(files[SOURCE_SPM]),
            str(files[TARGET_SPM]),
            str(files[VOCAB]),
            target_vocab_file=str(files[TARGET_VOCAB]) if TARGET_VOCAB in files else None,
            separate_vocabs=not tokenizer.joint,
            source_lang=languages[0],
            target_lang=languages[1],
            model_max_length=int(resolved_model(cfg).max_positions),
        )
    return model, hf_tokenizer
