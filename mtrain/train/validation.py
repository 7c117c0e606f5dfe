"""Validation loss: the label-smoothed loss and perplexity of a held-out split; and the
validation of a multilingual run, one per direction, folded into one (`mean_over_directions`)."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from mtrain.batches import EncodedCorpus, TokenBatchSampler, collate
from mtrain.config import Precision
from mtrain.model import Seq2SeqTransformer
from mtrain.runtime import autocast
from mtrain.tokenizer import SpecialIds
from mtrain.train.loss import TranslationLoss


@torch.inference_mode()
def validation_loss(
    model: Seq2SeqTransformer,
    corpus: EncodedCorpus,
    special_ids: SpecialIds,
    max_tokens: int,
    label_smoothing: float,
    device: torch.device,
    precision: Precision,
) -> dict[str, float]:
    """{loss, nll_loss, ppl} per target token of `corpus` (the model is left in eval mode)."""
    model.eval()
    loss_sum = nll_sum = tokens = 0.0
    sampler = TokenBatchSampler(corpus.src_lengths, corpus.tgt_lengths, max_tokens=max_tokens, seed=0, shuffle=False)
    objective = TranslationLoss(model, special_ids.pad, label_smoothing)
    for indices in sampler.batches(0):
        batch = collate(corpus, indices, special_ids.pad, special_ids.bos, special_ids.eos).to(device)
        with autocast(device, precision):
            loss, nll = objective(
                batch.src_tokens, batch.src_padding_mask, batch.tgt_input, batch.tgt_output, batch.num_tgt_tokens
            )
        loss_sum += float(loss)
        nll_sum += float(nll)
        tokens += batch.num_tgt_tokens
    results = {"loss": loss_sum / max(tokens, 1), "nll_loss": nll_sum / max(tokens, 1)}
    results["ppl"] = math.exp(min(results["nll_loss"], 50.0))
    return results


# Each direction's own scores in a multilingual validation (besides the means): few enough that
# the log line stays readable with four directions.
PER_DIRECTION = ("ppl", "bleu")


def mean_over_directions(results: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """One validation from each direction's (`{"de-en": {loss, ppl, bleu, ...}, ...}`): every
    key the mean over the directions (a perplexity the geometric mean: exp of the mean log),
    so that `bleu` -- what best.pt and patience follow -- is the mean BLEU; then each
    direction's `PER_DIRECTION` scores as `<direction>/<key>` (TensorBoard's `valid/de-en/bleu`).
    One direction: its results as they are."""
    if len(results) == 1:
        return dict(next(iter(results.values())))
    first = next(iter(results.values()))
    combined: dict[str, float] = {}
    for key in first:
        values = [direction[key] for direction in results.values()]
        if key.endswith("ppl"):
            combined[key] = math.exp(sum(math.log(value) for value in values) / len(values))
        else:
            combined[key] = sum(values) / len(values)
    for name, direction in results.items():
        combined.update({f"{name}/{key}": direction[key] for key in PER_DIRECTION if key in direction})
    return combined
