"""After the n-best: MBR's choice among candidates and reranking by features, as an engine.

`SelectingEngine` wraps any `Engine` (a decorator with the engine's own signature) and sits
between the engines and the translator: `selecting(engine, ...)` wraps it when
`decode.mbr.candidates` or `decode.rerank.weights` is set and returns the engine itself
otherwise (outputs are then exactly those of plain beam search or sampling). MBR
(mtrain.decode.selection.mbr) replaces the engine's n-best with its candidates ranked by expected
utility; reranking (mtrain.decode.selection.rerank) reorders the n-best it is given (with MBR: the
candidates, the expected utility a feature; without: the whole beam, whatever
`decode.nbest` keeps). `decode.nbest` of the result are kept. Its hypotheses carry `.text`
already (MBR compares texts), which the translator then leaves as it is: each is
detokenized once.

What selection does not combine with (prefixes, constraints, avoided phrases; MBR with
alignments and pictures) is refused before a decode by `mtrain.decoding_rules`; the checks
here only guard library callers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from mtrain.config import DecodeConfig, MbrCandidates, MbrUtility, Sampling, to_typed, with_values
from mtrain.decode.engines.engine import Engine
from mtrain.decode.search.constraints import ControlIds
from mtrain.decode.search.hypothesis import Hypothesis
from mtrain.decode.selection.mbr import hypotheses_per_sentence, mbr_decode
from mtrain.decode.selection.rerank import FeatureScorer, features_of, read_weights, rerank, weight_vector
from mtrain.decoding_rules import SELECTION_WITH_CONTROLS, SELECTION_WITH_PICTURES
from mtrain.errors import MtrainError

if TYPE_CHECKING:
    from mtrain.tokenizer import Tokenizer


def decoded_per_sentence(cfg: DecodeConfig) -> int:
    """Hypotheses decoded at once per sentence (the token budget divides by it)."""
    if cfg.uses_mbr:
        return hypotheses_per_sentence(cfg)
    return cfg.beam if cfg.sampling == Sampling.none else cfg.nbest


def describe_search(cfg: DecodeConfig) -> str:
    """How hypotheses are found and chosen, for a start line: `beam 5`, `greedy`, `top-p
    sampling (p=0.9), 4 samples`, `MBR-chrF over 16 beam candidates, reranked by forward+reverse`."""
    cfg = to_typed(cfg)  # (a composed node from a library caller: the dataclass whose predicates it reads)
    if cfg.uses_mbr:
        utility = {MbrUtility.chrf: "chrF", MbrUtility.bleu: "BLEU"}[MbrUtility(cfg.mbr.utility)]
        kind = {MbrCandidates.beam: "beam", MbrCandidates.sample: "sampled", MbrCandidates.both: "beam and sampled"}
        text = f"MBR-{utility} over {cfg.mbr.num_candidates} {kind[MbrCandidates(cfg.mbr.candidates)]} candidates"
        if cfg.mbr.num_pseudo_refs is not None:
            text += f" against {cfg.mbr.num_pseudo_refs} sampled pseudo-references"
    elif cfg.samples:
        sampling = Sampling(cfg.sampling)
        how = {
            Sampling.topk: f"top-k sampling (k={cfg.top_k})",
            Sampling.topp: f"top-p sampling (p={cfg.top_p:g})",
            Sampling.epsilon: f"epsilon sampling (epsilon={cfg.epsilon:g})",
        }[sampling]
        text = f"{how}, {cfg.nbest} sample{'s' if cfg.nbest != 1 else ''}"
    else:
        text = "greedy" if cfg.beam == 1 else f"beam {cfg.beam}"
    if cfg.uses_rerank:
        text += f", reranked by {'+'.join(features_of(cfg))}"
    if cfg.nbest > 1 and not cfg.samples:
        text += f", {cfg.nbest}-best"
    return text


def selecting(engine: Engine, tokenizer: Tokenizer, cfg: DecodeConfig, device: torch.device | str) -> Engine:
    """`engine` wrapped in a `SelectingEngine` when `cfg.selects` (MBR or reranking); else itself."""
    if not cfg.selects or isinstance(engine, SelectingEngine):
        return engine
    return SelectingEngine(engine, tokenizer, cfg, device)


class SelectingEngine:
    """An engine whose n-best is chosen by MBR and/or reranked (as `cfg.selects`);
    the reranking features (and their runs) are built once, from the `cfg` given here."""

    def __init__(self, engine: Engine, tokenizer: Tokenizer, cfg: DecodeConfig, device: torch.device | str) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.scorer = FeatureScorer(cfg, device) if cfg.uses_rerank else None
        self.weights = (
            weight_vector(read_weights(str(cfg.rerank.weights)), self.scorer.features) if self.scorer else None
        )

    def translate_batch(
        self,
        sources: Sequence[Sequence[int]],
        cfg: DecodeConfig,
        attention_layer: int | str | None = None,
        controls: Sequence[ControlIds | None] | None = None,
    ) -> list[list[Hypothesis]]:
        """Per source, up to `decode.nbest` hypotheses, best first, with `.text`."""
        if controls is not None and any(c is not None and not c.empty for c in controls):
            raise MtrainError(SELECTION_WITH_CONTROLS)
        tokenizer = self.tokenizer
        if cfg.uses_mbr:
            if attention_layer is not None:
                raise MtrainError(SELECTION_WITH_PICTURES)
            nbest = mbr_decode(self.engine, tokenizer, sources, cfg)
        else:  # reranking alone: the whole beam (or every sample) is reranked
            whole = with_values(cfg, nbest=cfg.beam) if cfg.sampling == Sampling.none else cfg
            nbest = self.engine.translate_batch(sources, whole, attention_layer)
            for hyps in nbest:
                for hyp in hyps:
                    hyp.text = tokenizer.decode_tgt(hyp.tokens)
        if self.scorer is not None and self.weights is not None:
            features = self.scorer(tokenizer, sources, nbest)
            nbest = [rerank(hyps, values, self.weights) for hyps, values in zip(nbest, features, strict=True)]
        return [hyps[: cfg.nbest] for hyps in nbest]
