"""Minimum Bayes risk (MBR) decoding: of N candidates, the one that agrees most with the others.

Beam search returns the most probable output; MBR (Kumar & Byrne 2004; Eikema & Aziz 2020;
Freitag et al. 2022, 2023) returns the candidate of highest *expected utility*: its mean
sentence score (chrF or BLEU, `mtrain.decode.selection.utility`) against M pseudo-references, which
stand in for the unknown reference as samples of the model's distribution. Per sentence:

1. candidates (`decode.mbr.candidates`): the beam's n-best (beam = nbest = N), N samples
   (`decode.sampling`; with sampling=none, epsilon sampling at `decode.epsilon`, which
   Freitag et al. 2023 found best), or both (ceil(N/2) from the beam, the rest sampled);
   a candidate whose text repeats an earlier one's is dropped (its utility would be the same);
2. pseudo-references: the candidates themselves, every draw counted (`num_pseudo_refs=null`),
   or M more samples drawn with the seed `decode.seed + 1`;
3. the N x M utility matrix in one call, its row means the expected utilities; the candidates
   are returned in that order, best first (ties keep the candidates' order: beam first, then
   by model score), each with `Hypothesis.expected_utility`.

Everything is seeded by `decode.seed`: the same input, batching and seed give the same output.
The engines decode the candidates as they decode anything (`Engine.translate_batch`), so MBR
works with ensembles and CTranslate2 alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from mtrain.config import DecodeConfig, MbrCandidates, MbrUtility, Sampling, with_values
from mtrain.decode.search.hypothesis import Hypothesis
from mtrain.decode.selection.utility import utility_matrix

if TYPE_CHECKING:
    from mtrain.decode.engines.engine import Engine
    from mtrain.tokenizer import Tokenizer


def hypotheses_per_sentence(cfg: DecodeConfig) -> int:
    """How many hypotheses MBR decodes per sentence at once (the batcher's token budget)."""
    return max(cfg.mbr.num_candidates, cfg.mbr.num_pseudo_refs or 0)


def beam_and_sample_counts(cfg: DecodeConfig) -> tuple[int, int]:
    """How many candidates come from the beam, how many are sampled."""
    n = cfg.mbr.num_candidates
    kind = MbrCandidates(cfg.mbr.candidates)
    if kind == MbrCandidates.beam:
        return n, 0
    if kind == MbrCandidates.sample:
        return 0, n
    from_beam = (n + 1) // 2
    return from_beam, n - from_beam


def sampling_config(cfg: DecodeConfig, count: int, seed: int) -> DecodeConfig:
    """`count` samples per sentence, drawn as `decode.sampling` says (none: epsilon sampling)."""
    sampling = Sampling(cfg.sampling)
    drawn: DecodeConfig = with_values(
        cfg, sampling=Sampling.epsilon if sampling == Sampling.none else sampling, nbest=count, beam=1, seed=seed
    )
    return drawn


def mbr_decode(
    engine: Engine, tokenizer: Tokenizer, sources: Sequence[Sequence[int]], cfg: DecodeConfig
) -> list[list[Hypothesis]]:
    """Per source (ids ending in eos), the candidates ranked by expected utility, best first
    (all of them: a reranker may use them; the translator keeps `cfg.nbest`), with `.text`."""
    candidates, references = draw_candidates(engine, tokenizer, sources, cfg)
    return [
        rank_by_expected_utility(hyps, refs, cfg.mbr.utility) for hyps, refs in zip(candidates, references, strict=True)
    ]


def draw_candidates(
    engine: Engine, tokenizer: Tokenizer, sources: Sequence[Sequence[int]], cfg: DecodeConfig
) -> tuple[list[list[Hypothesis]], list[list[str]]]:
    """Per source, the distinct candidates (with `.text`) and the pseudo-references' texts."""
    from_beam, sampled = beam_and_sample_counts(cfg)
    candidates: list[list[Hypothesis]] = [[] for _ in sources]
    if from_beam:
        beam_cfg = with_values(cfg, sampling=Sampling.none, beam=from_beam, nbest=from_beam)
        _extend(candidates, engine.translate_batch(sources, beam_cfg), tokenizer)
    if sampled:
        _extend(candidates, engine.translate_batch(sources, sampling_config(cfg, sampled, cfg.seed)), tokenizer)
    if cfg.mbr.num_pseudo_refs is None:
        references = [[hyp.text for hyp in hyps] for hyps in candidates]
    else:
        drawn = engine.translate_batch(sources, sampling_config(cfg, cfg.mbr.num_pseudo_refs, cfg.seed + 1))
        references = [[tokenizer.decode_tgt(hyp.tokens) for hyp in hyps] for hyps in drawn]
    return [distinct(hyps) for hyps in candidates], references


def _extend(candidates: list[list[Hypothesis]], decoded: list[list[Hypothesis]], tokenizer: Tokenizer) -> None:
    for kept, hyps in zip(candidates, decoded, strict=True):
        for hyp in hyps:
            hyp.text = tokenizer.decode_tgt(hyp.tokens)
        kept.extend(hyps)


def distinct(hypotheses: Sequence[Hypothesis]) -> list[Hypothesis]:
    """The hypotheses whose text no earlier one has, in order."""
    seen: set[str] = set()
    kept = []
    for hyp in hypotheses:
        if hyp.text not in seen:
            seen.add(hyp.text)
            kept.append(hyp)
    return kept


def expected_utilities(candidates: Sequence[str], references: Sequence[str], utility: MbrUtility | str) -> np.ndarray:
    """(N,) the mean utility of each candidate against the references (every reference
    counted as often as it occurs): one utility matrix over the distinct references."""
    distinct_refs, counts = np.unique(np.asarray(references, dtype=object), return_counts=True)
    matrix = utility_matrix(list(candidates), [str(ref) for ref in distinct_refs], utility)  # (N, distinct M)
    return matrix @ counts.astype(np.float64) / len(references)


def rank_by_expected_utility(
    candidates: Sequence[Hypothesis], references: Sequence[str], utility: MbrUtility | str
) -> list[Hypothesis]:
    """`candidates` (with `.text`) sorted by expected utility, best first, ties in their
    given order; each gets `.expected_utility`. One candidate is returned as it is."""
    if not candidates or not references:
        return list(candidates)
    expected = expected_utilities([hyp.text for hyp in candidates], references, utility)
    for hyp, value in zip(candidates, expected.tolist(), strict=True):
        hyp.expected_utility = float(value)
    order = np.argsort(-expected, kind="stable")
    return [candidates[i] for i in order]
