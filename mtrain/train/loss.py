"""Label-smoothed cross-entropy over target tokens; padding never counts."""

from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F


def sequence_loss(
    logits: torch.Tensor, targets: torch.Tensor, pad_id: int, label_smoothing: float
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Summed label-smoothed loss and summed NLL over the non-pad targets.

    logits: (batch, tgt_len, vocab), any float dtype (computed in fp32 for stability);
    targets: (batch, tgt_len) with pad_id at padding. Sums, not means: the trainer divides
    by the number of target tokens of the whole update (across accumulation and ranks).

    The smoothing mass is spread over the real vocabulary only: the model's padded rows
    (`model.vocab_multiple`) have -inf logits, and F.cross_entropy's own label_smoothing
    would give them a share and make every loss infinite.
    """
    flat_logits = logits.reshape(-1, logits.size(-1)).float()
    flat_targets = targets.reshape(-1)
    log_probs = F.log_softmax(flat_logits, dim=-1)  # (tokens, vocab)
    nll = F.nll_loss(log_probs, flat_targets, ignore_index=pad_id, reduction="none")  # (tokens,)
    if label_smoothing == 0.0:
        total = nll.sum()
        return total, total.detach()
    real = torch.isfinite(flat_logits).any(dim=0)  # (vocab,) False for padded rows
    uniform = -log_probs.where(real, 0.0).sum(dim=-1) / real.sum()  # (tokens,) mean over real rows
    smoothed = (1.0 - label_smoothing) * nll + label_smoothing * uniform
    smoothed = smoothed.where(flat_targets != pad_id, 0.0)
    return smoothed.sum(), nll.detach().sum()
