"""What decoding a set will cost on this machine, measured before the set is decoded.

`mtrain fit` under `train.max_time` must set aside, before its first update, the time its last
validation and its test decode will take. Decoding an untrained model's way would mislead: it
runs every sentence to its length limit. Instead `measure_step_cost` times a few decoding
steps of the model at two batch sizes, with every sentence held to exactly that many steps
(min_len = max_len), which gives a cost per step of a batch and a cost per step of each
sentence in it (its beam's rows); `decode_seconds` adds them up over the batches the set will
be decoded in (the batcher's own grouping), each sentence running to its reference's length,
about what a trained model emits. Finished sentences leave a batch (mtrain.decode.search.generator),
so a batch costs its longest sentence's steps once and every sentence's steps each.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mtrain.config import DecodeConfig, Precision, Sampling, with_values
from mtrain.decode.translation.translator import token_budget_batches, translate_encoded

# Sentences of the larger of the two timed batches (of the smaller: a sixteenth). Enough that the
# per-sentence cost shows above the per-batch one; few enough that measuring takes a fraction of
# a second with the CPU preset's model at beam 5.
PROBE_SENTENCES = 64
PROBE_STEPS = 6


@dataclass(frozen=True)
class StepCost:
    """Seconds of one decoding step: of a batch whatever its size, and of each sentence in it."""

    per_batch: float
    per_sentence: float


def hypotheses_per_sentence(cfg: DecodeConfig) -> int:
    """The rows a sentence takes in a decoding batch: its beam, or its samples."""
    return cfg.beam if cfg.sampling == Sampling.none else cfg.nbest


def measure_step_cost(
    model: Any,
    tokenizer: Any,
    sources: Sequence[Sequence[int]],
    cfg: DecodeConfig,
    device: torch.device,
    precision: Precision | str,
    steps: int = PROBE_STEPS,
) -> StepCost:
    """Time `steps` decoding steps of `sources[:PROBE_SENTENCES]` (encoded, ending in eos) and of
    a sixteenth of them, with `cfg`'s search; the cost per step of a batch and of a sentence."""
    held = with_values(cfg, max_len_a=0.0, max_len_b=steps, min_len=steps, no_repeat_ngram=0)
    large = [list(ids) for ids in sources[:PROBE_SENTENCES] if len(ids) > 0]
    small = large[: max(1, len(large) // 16)]
    budget = max(1, cfg.max_tokens // hypotheses_per_sentence(cfg))

    def seconds(batch: list[list[int]]) -> float:
        start = time.perf_counter()
        with torch.inference_mode():
            translate_encoded(model, tokenizer, batch, held, device, precision)
        return time.perf_counter() - start

    seconds(small)  # the first call builds what later ones reuse (kernels, caches)
    small_seconds = (seconds(small) + seconds(small)) / (2 * steps)
    large_seconds = (seconds(large) + seconds(large)) / (2 * steps)
    batches_small = len(token_budget_batches([len(s) for s in small], budget))
    batches_large = len(token_budget_batches([len(s) for s in large], budget))
    return _solve(small_seconds, batches_small, len(small), large_seconds, batches_large, len(large))


def _solve(small: float, batches_small: int, n_small: int, large: float, batches_large: int, n_large: int) -> StepCost:
    """per_batch and per_sentence from two timings (seconds per step = per_batch x batches +
    per_sentence x sentences). Noise on a busy machine can make one come out below 0: then the
    other explains the larger timing alone."""
    det = batches_small * n_large - batches_large * n_small
    per_batch = (small * n_large - large * n_small) / det if det else -1.0
    per_sentence = (batches_small * large - batches_large * small) / det if det else -1.0
    if per_batch < 0:
        return StepCost(0.0, large / max(n_large, 1))
    if per_sentence < 0:
        return StepCost(large / max(batches_large, 1), 0.0)
    return StepCost(per_batch, per_sentence)


def decode_seconds(cost: StepCost, src_lengths: Sequence[int], tgt_lengths: Sequence[int], cfg: DecodeConfig) -> float:
    """The seconds decoding sources of `src_lengths` (with eos) takes in the batches the batcher
    makes under `cfg`, each sentence running for its reference's length plus eos (`tgt_lengths`)
    within the length limit."""
    budget = max(1, cfg.max_tokens // hypotheses_per_sentence(cfg))
    steps = [
        max(1, min(int(tgt) + 1, int(cfg.max_len_a * int(src) + cfg.max_len_b)))
        for src, tgt in zip(src_lengths, tgt_lengths, strict=True)
    ]
    total = 0.0
    for batch in token_budget_batches([int(length) for length in src_lengths], budget):
        total += cost.per_batch * max(steps[i] for i in batch) + cost.per_sentence * sum(steps[i] for i in batch)
    return total
