"""Label-smoothed cross-entropy over target tokens; padding never counts."""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F


def sequence_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    pad_id: int,
    label_smoothing: float,
    vocab_size: Optional[int] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Summed label-smoothed loss and summed NLL over the non-pad targets.

    logits: (batch, tgt_len, padded vocab), any float dtype (computed in fp32 for
    stability); targets: (batch, tgt_len) with pad_id at padding. Sums, not means: the
    trainer divides by the number of target tokens of the whole update (across
    accumulation and ranks).

    The smoothing mass is spread over the real vocabulary only: the model's padded rows
    (`model.vocab_multiple`, -inf logits) are cut off first — by `vocab_size` when given,
    else found as the trailing -inf columns of the first row.
    """
    flat_logits = logits.reshape(-1, logits.size(-1))
    if vocab_size is None:
        vocab_size = int(torch.isfinite(flat_logits[0]).sum()) if flat_logits.numel() else logits.size(-1)
    if vocab_size < flat_logits.size(-1):
        flat_logits = flat_logits[:, :vocab_size]
    flat_targets = targets.reshape(-1)
    # One log-softmax serves both the training loss and the NLL reported as perplexity.
    log_probs = F.log_softmax(flat_logits.float(), dim=-1)  # (tokens, vocab)
    not_pad = flat_targets != pad_id
    nll = -log_probs.gather(1, flat_targets.clamp(max=vocab_size - 1)[:, None]).squeeze(1)
    nll = nll.where(not_pad, 0.0)
    if label_smoothing == 0.0:
        total = nll.sum()
        return total, total.detach()
    uniform = -log_probs.mean(dim=-1).where(not_pad, 0.0)  # cross-entropy with the uniform distribution
    smoothed = (1.0 - label_smoothing) * nll + label_smoothing * uniform
    return smoothed.sum(), nll.detach().sum()
