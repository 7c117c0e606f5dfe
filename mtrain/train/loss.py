"""Label-smoothed cross-entropy over target tokens; padding never counts."""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F


class _SmoothedCrossEntropy(torch.autograd.Function):
    """Summed label-smoothed loss and NLL of (tokens, vocab) logits, with a hand-written backward.

    The gradient of cross-entropy against the target distribution q = (1-eps) onehot + eps/V
    is softmax - q, so the backward is one in-place pass over the saved log-probabilities
    (exp, subtract eps/V, scale by the row's weight) plus one scatter at the targets. Autograd
    through gather, mean and log_softmax instead fills a zero (tokens, vocab) tensor for the
    gather, expands and divides one for the mean, adds them and runs the log-softmax backward:
    four more passes over the largest activation of the model.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, not_pad: torch.Tensor,  # type: ignore[override]
                label_smoothing: float) -> Tuple[torch.Tensor, torch.Tensor]:
        log_probs = F.log_softmax(logits.float(), dim=-1)  # (tokens, vocab)
        nll = -log_probs.gather(1, targets[:, None]).squeeze(1)
        weights = not_pad.to(log_probs.dtype)
        nll_sum = torch.dot(nll, weights)
        loss = nll_sum.clone()  # a tensor of its own: nll_sum is marked non-differentiable
        if label_smoothing != 0.0:
            # cross-entropy with the uniform distribution: -mean(log_probs) per row
            uniform = log_probs.mean(dim=-1).neg_()
            loss = (1.0 - label_smoothing) * nll_sum + label_smoothing * torch.dot(uniform, weights)
        ctx.save_for_backward(log_probs, targets, weights)
        ctx.label_smoothing = label_smoothing
        ctx.logits_dtype = logits.dtype
        ctx.mark_non_differentiable(nll_sum)
        return loss, nll_sum

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor, _grad_nll: torch.Tensor):  # type: ignore[override]
        log_probs, targets, weights = ctx.saved_tensors
        eps = ctx.label_smoothing
        grad = log_probs.exp_()  # softmax, in the saved buffer: it is not needed again
        if eps != 0.0:
            grad.sub_(eps / grad.size(-1))
        row_scale = weights * grad_loss
        grad.scatter_add_(1, targets[:, None], torch.full_like(targets[:, None], eps - 1.0, dtype=grad.dtype))
        grad.mul_(row_scale[:, None])
        return grad.to(ctx.logits_dtype), None, None, None


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
    accumulation and ranks). The NLL is detached (it is reported, not trained on).

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
    not_pad = flat_targets != pad_id
    # pad_id may lie outside a cut vocabulary; its rows are weighted 0 anyway
    return _SmoothedCrossEntropy.apply(flat_logits, flat_targets.clamp(max=vocab_size - 1), not_pad, label_smoothing)
