"""After the n-best: MBR's choice among candidates and reranking by features, when asked.

`translate_encoded` hands each batch here when `decode.mbr.candidates` or
`decode.rerank.weights` is set, and to the engine alone otherwise (outputs are then exactly
those of plain beam search or sampling). MBR (mtrain.decode.mbr) replaces the engine's
n-best with its candidates ranked by expected utility; reranking (mtrain.decode.rerank)
reorders the n-best it is given (with MBR: the candidates, the expected utility a feature;
without: the whole beam, whatever `decode.nbest` keeps). `decode.nbest` of the result are kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from mtrain.config import DecodeConfig, Sampling, with_values
from mtrain.decode.hypothesis import Hypothesis
from mtrain.decode.mbr import hypotheses_per_sentence, mbr_decode, uses_mbr
from mtrain.decode.rerank import FeatureScorer, read_weights, rerank, uses_rerank, weight_vector
from mtrain.errors import MtrainError

if TYPE_CHECKING:
    from mtrain.decode.translator import Engine
    from mtrain.tokenizer import Tokenizer


# MBR draws and ranks its own candidates, and reranking reorders the n-best by features that
# know nothing of a forced prefix or required phrases: not combined with them (yet).
SELECTION_WITH_CONTROLS = (
    "MBR decoding and n-best reranking (decode.mbr, decode.rerank) do not take prefixes, constraints, "
    "terms or avoided phrases: decode those with beam search"
)
SELECTION_WITH_ALIGNMENT = (
    "MBR decoding (decode.mbr) keeps no attention for word alignments or markup: "
    "decode those with beam search (decode.mbr.candidates=none)"
)


def selects(cfg: DecodeConfig) -> bool:
    """Whether decoding with `cfg` goes through `NbestSelection`."""
    return uses_mbr(cfg) or uses_rerank(cfg)


def decoded_per_sentence(cfg: DecodeConfig) -> int:
    """Hypotheses decoded at once per sentence (the token budget divides by it)."""
    if uses_mbr(cfg):
        return hypotheses_per_sentence(cfg)
    return cfg.beam if cfg.sampling == Sampling.none else cfg.nbest


class NbestSelection:
    """Decode a batch with MBR and/or reranking (`cfg` as `selects` says)."""

    def __init__(self, cfg: DecodeConfig, device: torch.device | str) -> None:
        self.cfg = cfg
        self.scorer = FeatureScorer(cfg, device) if uses_rerank(cfg) else None
        self.weights = (
            weight_vector(read_weights(str(cfg.rerank.weights)), self.scorer.features) if self.scorer else None
        )

    def translate_batch(
        self,
        engine: Engine,
        tokenizer: Tokenizer,
        sources: Sequence[Sequence[int]],
        attention_layer: int | str | None = None,
    ) -> list[list[Hypothesis]]:
        """Per source, up to `decode.nbest` hypotheses, best first, with `.text`."""
        cfg = self.cfg
        if uses_mbr(cfg):
            if attention_layer is not None:
                raise MtrainError(
                    "attention pictures come from beam search or sampling: leave decode.mbr.candidates=none"
                )
            nbest = mbr_decode(engine, tokenizer, sources, cfg)
        else:  # reranking alone: the whole beam (or every sample) is reranked
            whole = with_values(cfg, nbest=cfg.beam) if cfg.sampling == Sampling.none else cfg
            nbest = engine.translate_batch(sources, whole, attention_layer)
            for hyps in nbest:
                for hyp in hyps:
                    hyp.text = tokenizer.decode_tgt(hyp.tokens)
        if self.scorer is not None and self.weights is not None:
            features = self.scorer(tokenizer, sources, nbest)
            nbest = [rerank(hyps, values, self.weights) for hyps, values in zip(nbest, features, strict=True)]
        return [hyps[: cfg.nbest] for hyps in nbest]
