"""Validation loss: the label-smoothed loss and perplexity of a held-out split."""

from __future__ import annotations

import math
from typing import Dict

import torch

from mtrain.batches import EncodedCorpus, TokenBatchSampler, collate
from mtrain.config import Precision
from mtrain.runtime import autocast
from mtrain.tokenizer import SpecialIds
from mtrain.train.loss import TranslationLoss


@torch.inference_mode()
def validation_loss(model: torch.nn.Module, corpus: EncodedCorpus, special_ids: SpecialIds, max_tokens: int,
                    label_smoothing: float, device: torch.device, precision: Precision) -> Dict[str, float]:
    """{loss, nll_loss, ppl} per target token of `corpus` (the model is left in eval mode)."""
    model.eval()
    loss_sum = nll_sum = tokens = 0.0
    sampler = TokenBatchSampler(corpus.src_lengths, corpus.tgt_lengths, max_tokens=max_tokens, seed=0, shuffle=False)
    objective = TranslationLoss(model, special_ids.pad, label_smoothing)
    for indices in sampler.batches(0):
        batch = collate(corpus, indices, special_ids.pad, special_ids.bos, special_ids.eos).to(device)
        with autocast(device, precision):
            loss, nll = objective(batch.src_tokens, batch.src_padding_mask, batch.tgt_input, batch.tgt_output,
                                  batch.num_tgt_tokens)
        loss_sum += float(loss)
        nll_sum += float(nll)
        tokens += batch.num_tgt_tokens
    results = {"loss": loss_sum / max(tokens, 1), "nll_loss": nll_sum / max(tokens, 1)}
    results["ppl"] = math.exp(min(results["nll_loss"], 50.0))
    return results
