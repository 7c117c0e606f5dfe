"""What decoding returns for one sentence: a hypothesis and its score."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Hypothesis:
    """One output sequence of the decoder.

    `score` is the length-normalised log-probability `log_prob / length**alpha`, where
    `length` counts the output tokens *including* the final EOS (see `length_normalise`).
    """

    tokens: list[int]  # target ids, without bos/eos
    score: float  # length-normalised log-probability (what hypotheses are ranked by)
    log_prob: float = 0.0  # sum of the token log-probabilities, EOS included
    text: str = ""  # detokenized `tokens`, filled by the translator
    # MBR decoding: the mean utility (chrF or BLEU, 0-100) against the pseudo-references
    # (mtrain.decode.selection.mbr), a confidence score; None without MBR.
    expected_utility: float | None = None
    # n-best reranking: the weighted sum of the features (mtrain.decode.selection.rerank); None without.
    rerank_score: float | None = None
    # The translation's confidence in [0, 1] (mtrain.decode.translation.confidence), set when the
    # request finishes (`Options.confidence`); None when not asked for, or for a blank source.
    confidence: float | None = None
    # Cross-attention averaged over heads (or one head's), one row per output token incl. EOS:
    # (len(tokens) + 1, src_len), or (len(tokens) + 1, layers, src_len) for all layers.
    # Only when asked for (attention pictures, word alignments).
    attention: torch.Tensor | None = field(default=None, repr=False)
    # (source, target) word or piece links (`decode.alignment`; mtrain.decode.translation.alignment).
    alignment: list[tuple[int, int]] | None = None


def length_normalise(log_prob: torch.Tensor, length: torch.Tensor | int, alpha: float) -> torch.Tensor:
    """`log_prob / length**alpha`: fairseq's length penalty (alpha=1 is the mean log-prob per token).

    `length` is the number of output tokens including EOS, so an empty output (EOS only)
    has length 1 and no division by zero can happen.
    """
    if alpha == 0.0:
        return log_prob
    length = torch.as_tensor(length, dtype=log_prob.dtype, device=log_prob.device)
    return log_prob / length.pow(alpha)
