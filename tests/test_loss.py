"""The training loss: the output projection fused with label-smoothed cross-entropy.

Checked against torch's own `F.cross_entropy(label_smoothing=...)` on materialised logits:
loss, NLL and both gradients, fp32 and bf16, padding and chunking included.
"""

import pytest
import torch
import torch.nn.functional as F

import mtrain.train.loss as loss_module
from mtrain.config import ModelConfig
from mtrain.model import build_model
from mtrain.train.loss import TranslationLoss, output_loss

PAD = 1


def reference_loss(hidden, weight, targets, pad, eps):
    """torch's label-smoothed cross-entropy (smoothing over all classes) of hidden @ weight.T, summed."""
    logits = (hidden @ weight.t()).reshape(-1, weight.shape[0]).float()
    flat_targets = targets.reshape(-1)
    loss = F.cross_entropy(logits, flat_targets, ignore_index=pad, label_smoothing=eps, reduction="sum")
    nll = F.cross_entropy(logits, flat_targets, ignore_index=pad, reduction="sum")
    return loss, nll


def _inputs(seed=0, vocab=50, d=16):
    torch.manual_seed(seed)
    hidden = torch.randn(6, 9, d)
    weight = torch.randn(vocab, d) * 0.5
    targets = torch.randint(2, vocab, (6, 9))
    targets[0, 5:] = PAD
    targets[3, 1:] = PAD
    return hidden, weight, targets


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("chunk_elements", [50, 7 * 50, 1 << 21])  # one row, 7 rows, everything
def test_loss_and_gradients_equal_torch_cross_entropy(eps, chunk_elements, monkeypatch):
    monkeypatch.setattr(loss_module, "_CPU_CHUNK_ELEMENTS", chunk_elements)
    hidden, weight, targets = _inputs()
    h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    h_ref, w_ref = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    loss, nll = output_loss(h, w, targets, PAD, eps)
    expected_loss, expected_nll = reference_loss(h_ref, w_ref, targets, PAD, eps)
    (loss * 0.5).backward()
    (expected_loss * 0.5).backward()
    assert torch.allclose(loss, expected_loss, rtol=1e-5)
    assert torch.allclose(nll, expected_nll, rtol=1e-5)
    assert not nll.requires_grad
    assert torch.allclose(h.grad, h_ref.grad, atol=1e-5)
    assert torch.allclose(w.grad, w_ref.grad, atol=1e-5)
    assert (h.grad[3, 1:] == 0).all() and (h.grad[0, 5:] == 0).all()  # padding gets no gradient


def test_padding_rows_never_count_and_the_token_count_may_be_given():
    hidden, weight, targets = _inputs()
    loss, nll = output_loss(hidden, weight, targets, PAD, 0.1)
    changed = hidden.clone()
    changed[3, 1:] = torch.randn(8, 16) * 100
    given = output_loss(changed, weight, targets, PAD, 0.1, num_tokens=int((targets != PAD).sum()))
    assert torch.equal(loss, given[0]) and torch.equal(nll, given[1])


def test_bf16_autocast_runs_the_products_in_bf16_and_tracks_fp32():
    hidden, weight, targets = _inputs(vocab=300, d=32)
    h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, nll = output_loss(h, w, targets, PAD, 0.1)
    loss.backward()
    h_ref, w_ref = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    expected_loss, _ = reference_loss(h_ref, w_ref, targets, PAD, 0.1)
    expected_loss.backward()
    assert h.grad.dtype == torch.float32 and w.grad.dtype == torch.float32
    assert torch.allclose(loss, expected_loss, rtol=2e-2)
    assert torch.allclose(h.grad, h_ref.grad, atol=5e-2)
    assert torch.allclose(w.grad, w_ref.grad, atol=5e-2)


def test_without_gradients_only_the_loss_is_computed():
    hidden, weight, targets = _inputs()
    with torch.no_grad():
        loss, nll = output_loss(hidden, weight, targets, PAD, 0.1)
    assert torch.allclose(loss, reference_loss(hidden, weight, targets, PAD, 0.1)[0], rtol=1e-5)


def test_model_loss_equals_cross_entropy_of_its_logits_and_ignores_padded_vocabulary_rows():
    """TranslationLoss (decoder states + fused loss) = cross-entropy of model(...)'s logits,
    whose padded vocabulary rows are -inf; the smoothing mass never reaches those rows."""
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=16, heads=2, ffn_dim=32, encoder_layers=1, decoder_layers=1, dropout=0.0,
                      vocab_multiple=8)
    model = build_model(cfg, 37, 37, PAD, joint_vocab=True)  # 37 rows padded to 40
    src = torch.randint(3, 37, (3, 5))
    tgt_in = torch.randint(3, 37, (3, 4))
    tgt_out = torch.randint(3, 37, (3, 4))
    tgt_out[2, 2:] = PAD
    mask = torch.zeros(3, 5, dtype=torch.bool)
    loss, nll = TranslationLoss(model, PAD, 0.1)(src, mask, tgt_in, tgt_out)
    logits = model(src, mask, tgt_in)
    assert logits.shape[-1] == 40 and torch.isinf(logits[..., 37:]).all()
    flat = logits[..., :37].reshape(-1, 37)
    expected = F.cross_entropy(flat, tgt_out.reshape(-1), ignore_index=PAD, label_smoothing=0.1, reduction="sum")
    assert torch.allclose(loss, expected, rtol=1e-5)
    loss.backward()
    assert model.output_proj.weight.grad[37:].abs().sum() == 0
