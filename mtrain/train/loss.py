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
    """
    flat_logits = logits.reshape(-1, logits.size(-1)).float()
    flat_targets = targets.reshape(-1)
    smoothed = F.cross_entropy(
        flat_logits, flat_targets, ignore_index=pad_id, reduction="sum", label_smoothing=label_smoothing
    )
    if label_smoothing == 0.0:
        return smoothed, smoothed.detach()
    with torch.no_grad():
        nll = F.cross_entropy(flat_logits, flat_targets, ignore_index=pad_id, reduction="sum")
    return smoothed, nll
