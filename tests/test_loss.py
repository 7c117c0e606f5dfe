"""The training loss: padding never counts; label smoothing as defined."""

import torch
import torch.nn.functional as F

from mtrain.train.loss import sequence_loss

PAD = 1


def test_padding_positions_do_not_count():
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 7)
    targets = torch.tensor([[4, 5, 3, PAD], [6, 3, PAD, PAD]])
    loss, nll = sequence_loss(logits, targets, PAD, label_smoothing=0.1)
    changed = logits.clone()
    changed[0, 3] = torch.randn(7) * 100
    changed[1, 2:] = torch.randn(2, 7) * 100
    loss2, nll2 = sequence_loss(changed, targets, PAD, label_smoothing=0.1)
    assert torch.allclose(loss, loss2) and torch.allclose(nll, nll2)
    expected_nll = sum(
        -F.log_softmax(logits[b, t], -1)[targets[b, t]] for b in range(2) for t in range(4) if targets[b, t] != PAD
    )
    assert torch.allclose(nll, expected_nll)


def test_label_smoothing_formula():
    torch.manual_seed(0)
    logits = torch.randn(1, 3, 5)
    targets = torch.tensor([[2, 4, 3]])
    eps = 0.2
    loss, _ = sequence_loss(logits, targets, PAD, label_smoothing=eps)
    logp = F.log_softmax(logits[0], -1)
    expected = sum((1 - eps) * -logp[t, targets[0, t]] + eps * -logp[t].mean() for t in range(3))
    assert torch.allclose(loss, expected, atol=1e-5)


def test_padded_vocabulary_rows_do_not_make_the_loss_infinite():
    # The model pads its output rows to model.vocab_multiple and gives them -inf logits.
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 5)
    padded = torch.cat([logits, torch.full((2, 3, 3), float("-inf"))], dim=-1)
    targets = torch.tensor([[2, 4, 3], [0, PAD, PAD]])
    loss, nll = sequence_loss(logits, targets, PAD, label_smoothing=0.1)
    padded_loss, padded_nll = sequence_loss(padded, targets, PAD, label_smoothing=0.1)
    assert torch.isfinite(padded_loss)
    assert torch.allclose(loss, padded_loss) and torch.allclose(nll, padded_nll)
    padded.requires_grad_(True)
    sequence_loss(padded, targets, PAD, label_smoothing=0.1)[0].backward()
    assert torch.isfinite(padded.grad).all() and (padded.grad[..., 5:] == 0).all()


def reference_loss(logits, targets, pad, eps):
    """torch's own label-smoothed cross-entropy (smoothing over all classes), summed."""
    flat = logits.reshape(-1, logits.size(-1)).float()
    flat_targets = targets.reshape(-1)
    loss = F.cross_entropy(flat, flat_targets, ignore_index=pad, label_smoothing=eps, reduction="sum")
    nll = F.cross_entropy(flat, flat_targets, ignore_index=pad, reduction="sum")
    return loss, nll


def test_loss_and_gradient_equal_torch_cross_entropy():
    """The hand-written backward gives torch's gradient, in fp32 and for bf16 logits."""
    torch.manual_seed(0)
    targets = torch.randint(2, 50, (6, 9))
    targets[0, 5:] = PAD
    targets[3, 1:] = PAD
    for dtype, tolerance in ((torch.float32, 1e-5), (torch.bfloat16, 1e-2)):
        for eps in (0.0, 0.1):
            logits = (torch.randn(6, 9, 50) * 3).to(dtype).requires_grad_(True)
            reference = logits.detach().clone().requires_grad_(True)
            loss, nll = sequence_loss(logits, targets, PAD, label_smoothing=eps)
            expected_loss, expected_nll = reference_loss(reference, targets, PAD, eps)
            (loss * 0.5).backward()
            (expected_loss * 0.5).backward()
            assert torch.allclose(loss, expected_loss, rtol=1e-6 if dtype == torch.float32 else 1e-3)
            assert torch.allclose(nll, expected_nll, rtol=1e-6 if dtype == torch.float32 else 1e-3)
            assert not nll.requires_grad
            assert logits.grad.dtype == dtype
            assert torch.allclose(logits.grad.float(), reference.grad.float(), atol=tolerance)
            assert (logits.grad[3, 1:] == 0).all()  # padding gets no gradient
