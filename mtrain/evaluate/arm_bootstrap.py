"""Paired bootstrap of arms over sentences and seeds: is an arm's difference more than noise?

Two noises make one arm score apart from another: which sentences the test set happens to
hold, and which seeds the arms happen to be trained with. sacreBLEU's paired bootstrap
resamples sentences only, so it calls a seed's luck an effect. Here each resample draws the
test sentences with replacement (the same draw for every arm: the arms translated the same
sentences) and, for each arm, its seeds with replacement; an arm's resampled score is the mean
of its drawn seeds' corpus scores on the drawn sentences. Corpus scores come from sacreBLEU's
sufficient statistics per sentence, summed over the draw, exactly as sacreBLEU's bootstrap does.

The p-value is two-sided: the share of resampled differences, shifted to mean 0 (no effect),
at least as far from 0 as the observed one, with the usual +1 smoothing. An arm of one seed
contributes no seed variance: the notes say so.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mtrain.errors import MtrainError
from mtrain.evaluate.metrics import build_metric, check_lengths, check_metric_names


@dataclass(frozen=True)
class ArmDifference:
    """One arm's mean score over its seeds and (except the baseline arm) its difference to the baseline."""

    mean: float  # mean over seeds of the corpus score
    difference: float | None = None  # mean minus the baseline arm's mean
    low: float | None = None  # 95% bootstrap interval of the difference
    high: float | None = None
    p_value: float | None = None
    identical_to_baseline: bool = False  # every seed's hypotheses are the baseline arm's, line for line


def bootstrap_seed() -> int | None:
    """sacreBLEU's `$SACREBLEU_SEED` (default 12345; `none`: not fixed), so reruns give the same numbers."""
    seed = os.environ.get("SACREBLEU_SEED", "12345")
    return None if seed.lower() == "none" else int(seed)


def arm_bootstrap(
    arms: Sequence[tuple[str, Sequence[Sequence[str]]]],
    refs: Sequence[Sequence[str]],
    metrics: Sequence[str] = ("bleu", "chrf"),
    num_samples: int = 1000,
    tokenize: str = "13a",
    lowercase: bool = False,
    chrf_word_order: int = 0,
) -> dict[str, dict[str, ArmDifference]]:
    """Arms 2..n against the first: `arms` is [(arm name, [hypotheses of each seed])].

    Returns results[arm][metric].
    """
    names = check_metric_names(metrics)
    if len(arms) < 2:
        raise MtrainError("arm bootstrap needs at least two arms with hypotheses")
    if num_samples < 1:
        raise MtrainError(f"bootstrap_samples={num_samples}: must be at least 1")
    refs = [list(stream) for stream in refs]
    sentences = len(refs[0])
    for name, seeds in arms:
        if not seeds:
            raise MtrainError(f"arm {name}: no hypotheses")
        for hyps in seeds:
            check_lengths(len(hyps), [len(stream) for stream in refs], f"hypotheses of arm {name}")
    rng = np.random.default_rng(bootstrap_seed())
    # (samples, sentences): how often each sentence is drawn; one draw shared by every arm.
    draws = rng.integers(sentences, size=(num_samples, sentences))
    counts = np.stack([np.bincount(row, minlength=sentences) for row in draws]).astype(np.float64)
    seed_draws = [rng.integers(len(seeds), size=(num_samples, len(seeds))) for _, seeds in arms]

    baseline_seeds = [list(hyps) for hyps in arms[0][1]]
    results: dict[str, dict[str, ArmDifference]] = {name: {} for name, _ in arms}
    for metric_name in names:
        metric = build_metric(metric_name, tokenize, lowercase, chrf_word_order, references=refs)
        observed, resampled = [], []  # per arm: the mean score, and (samples,) resampled means
        for (_, seeds), chosen in zip(arms, seed_draws, strict=True):
            seed_scores, seed_resamples = [], []
            for hyps in seeds:
                stats = np.array(metric._extract_corpus_statistics(list(hyps), None), dtype=np.float64)
                seed_scores.append(metric._compute_score_from_stats(stats.sum(0)).score)
                sums = counts @ stats  # (samples, statistics)
                seed_resamples.append([metric._compute_score_from_stats(row).score for row in sums])
            per_seed = np.array(seed_resamples).T  # (samples, seeds)
            observed.append(float(np.mean(seed_scores)))
            resampled.append(np.take_along_axis(per_seed, chosen, axis=1).mean(axis=1))
        results[arms[0][0]][metric_name] = ArmDifference(observed[0])
        for index, (name, seeds) in enumerate(arms[1:], start=1):
            difference = observed[index] - observed[0]
            differences = resampled[index] - resampled[0]
            identical = len(seeds) == len(baseline_seeds) and all(
                list(hyps) == base for hyps, base in zip(seeds, baseline_seeds, strict=True)
            )
            if identical:
                results[name][metric_name] = ArmDifference(observed[index], 0.0, 0.0, 0.0, None, True)
                continue
            null = np.abs(differences - differences.mean())
            p_value = (np.sum(null >= abs(difference)) + 1) / (num_samples + 1)
            low, high = np.percentile(differences, [2.5, 97.5])
            results[name][metric_name] = ArmDifference(
                observed[index], difference, float(low), float(high), float(p_value)
            )
    return results
