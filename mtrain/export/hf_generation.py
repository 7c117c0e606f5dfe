"""mtrain's decoding settings as a transformers `GenerationConfig` (generation_config.json).

transformers' beam search follows the rules of mtrain's (mtrain.decode.search.generator), so with
these settings `model.generate` returns mtrain's translations (docs/EXPORT.md has the counts):

    mtrain                                   transformers
    decoder starts from bos                  decoder_start_token_id = bos
    beam, greedy at beam 1                   num_beams (do_sample false)
    2 x beam candidates a step; an EOS among the first `beam` finishes a hypothesis, the first
    `beam` others live on                    the same (_beam_search's top-k of 2 x num_beams)
    score = log_prob / length**alpha, length = output tokens incl. EOS
                                             length_penalty = alpha, the same length
    early_stopping true: done at `beam` finished
                                             early_stopping=True
    early_stopping false: done when no live hypothesis can still win (exact bound)
                                             early_stopping="never" (the bound at the global
                                             max_new_tokens, not the sentence's)
    pad, bos and the run's tags banned after the log-softmax
                                             suppress_tokens (a logits processor, applied after
                                             the log-softmax in beam search)
    min_len output tokens before EOS         min_new_tokens
    no_repeat_ngram                          no_repeat_ngram_size

The length limit has no counterpart: mtrain's is per sentence, `max_len_a * src_len +
max_len_b` output tokens (src_len counts the source's eos) and then EOS is forced, with its
own log-probability; transformers' `max_length`/`max_new_tokens` is one number for a batch,
and a hypothesis that reaches it ends there without EOS. The config's `max_new_tokens` is
the position table's limit (max_positions - 1 tokens, then EOS), mtrain's own ceiling; the
model card shows how to pass the per-sentence limit, and `max_len_a`/`max_len_b` are stored
with the settings (`mtrain_max_len_a`, `mtrain_max_len_b`). Translations that reach the limit
can differ; no others do, but for near-ties.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from mtrain.config import DecodeConfig
from mtrain.tokenizer import SpecialIds


def generation_settings(
    decode: DecodeConfig, special: SpecialIds, banned_ids: Sequence[int], max_positions: int
) -> dict[str, Any]:
    """The `GenerationConfig` arguments for decoding as `decode` says (the run's `decode`
    section: what its test scores were decoded with); `banned_ids`: the run's tag ids."""
    settings: dict[str, Any] = dict(
        decoder_start_token_id=special.bos,
        bos_token_id=special.bos,
        eos_token_id=special.eos,
        pad_token_id=special.pad,
        forced_eos_token_id=None,
        num_beams=int(decode.beam),
        do_sample=False,
        length_penalty=float(decode.length_penalty),
        early_stopping=True if decode.early_stopping else "never",
        min_new_tokens=int(decode.min_len),
        max_new_tokens=int(max_positions),
        suppress_tokens=[special.pad, special.bos, *banned_ids],
        mtrain_max_len_a=float(decode.max_len_a),
        mtrain_max_len_b=int(decode.max_len_b),
    )
    if decode.no_repeat_ngram > 0:
        settings["no_repeat_ngram_size"] = int(decode.no_repeat_ngram)
    return settings


def max_new_tokens(source_length: int, max_len_a: float, max_len_b: int, max_positions: int) -> int:
    """mtrain's length limit for a source of `source_length` ids (eos included): how many
    tokens mtrain's decoder may output before its forced EOS (computed in float32, as there)."""
    limit = int((max_len_a * torch.tensor(float(source_length)) + max_len_b).long())
    return max(0, min(limit, max_positions - 1))
