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
        loss, _nll = output_loss(h, w, targets, PAD, 0.1)
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
        loss, _nll = output_loss(hidden, weight, targets, PAD, 0.1)
    assert torch.allclose(loss, reference_loss(hidden, weight, targets, PAD, 0.1)[0], rtol=1e-5)


def test_model_loss_equals_cross_entropy_of_its_logits_and_ignores_padded_vocabulary_rows():
    """TranslationLoss (decoder states + fused loss) = cross-entropy of model(...)'s logits,
    whose padded vocabulary rows are -inf; the smoothing mass never reaches those rows."""
    torch.manual_seed(0)
    cfg = ModelConfig(
        d_model=16, heads=2, ffn_dim=32, encoder_layers=1, decoder_layers=1, dropout=0.0, vocab_multiple=8
    )
    model = build_model(cfg, 37, 37, PAD, joint_vocab=True)  # 37 rows padded to 40
    src = torch.randint(3, 37, (3, 5))
    tgt_in = torch.randint(3, 37, (3, 4))
    tgt_out = torch.randint(3, 37, (3, 4))
    tgt_out[2, 2:] = PAD
    mask = torch.zeros(3, 5, dtype=torch.bool)
    loss, _nll = TranslationLoss(model, PAD, 0.1)(src, mask, tgt_in, tgt_out)
    logits = model(src, mask, tgt_in)
    assert logits.shape[-1] == 40 and torch.isinf(logits[..., 37:]).all()
    flat = logits[..., :37].reshape(-1, 37)
    expected = F.cross_entropy(flat, tgt_out.reshape(-1), ignore_index=PAD, label_smoothing=0.1, reduction="sum")
    assert torch.allclose(loss, expected, rtol=1e-5)
    loss.backward()
    assert model.output_proj.weight.grad[37:].abs().sum() == 0


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("chunk_elements", [20, 7 * 20, 1 << 21])
def test_a_restricted_output_vocabulary_is_cross_entropy_over_its_rows_only(eps, chunk_elements, monkeypatch):
    """vocab_ids: softmax and smoothing over those rows; rows outside get no gradient."""
    monkeypatch.setattr(loss_module, "_CPU_CHUNK_ELEMENTS", chunk_elements)
    hidden, weight, _ = _inputs()
    vocab_ids = torch.tensor([0, 3, 4, 8, 9, 11, 20, 21, 30, 31, 40, 41, 42, 44, 45, 46, 47, 48, 49, 2])
    vocab_ids = vocab_ids.sort().values
    positions = torch.randint(0, len(vocab_ids), (6, 9))
    targets = vocab_ids[positions]
    targets[0, 5:] = PAD
    h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    h_ref, w_ref = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    loss, nll = output_loss(h, w, targets, PAD, eps, vocab_ids=vocab_ids)
    keep = targets.reshape(-1) != PAD
    logits = (h_ref.reshape(-1, 16) @ w_ref[vocab_ids].t())[keep]
    expected_loss = F.cross_entropy(logits, positions.reshape(-1)[keep], label_smoothing=eps, reduction="sum")
    expected_nll = F.cross_entropy(logits, positions.reshape(-1)[keep], reduction="sum")
    loss.backward()
    expected_loss.backward()
    assert torch.allclose(loss, expected_loss, rtol=1e-5) and torch.allclose(nll, expected_nll, rtol=1e-5)
    assert torch.allclose(h.grad, h_ref.grad, atol=1e-5)
    assert torch.allclose(w.grad, w_ref.grad, atol=1e-5)
    outside = torch.ones(50, dtype=torch.bool)
    outside[vocab_ids] = False
    assert (w.grad[outside] == 0).all() and outside.sum() == 30


def test_a_target_outside_the_restricted_vocabulary_gets_a_finite_nll():
    """Validation may hold a piece the training targets never had: its NLL is the row's
    logsumexp over the softmax rows minus its own logit, not infinity."""
    hidden, weight, _ = _inputs()
    vocab_ids = torch.arange(0, 50, 2)
    targets = torch.full((6, 9), 4)
    targets[1, 3] = 7  # odd: outside
    with torch.no_grad():
        _, nll = output_loss(hidden, weight, targets, PAD, 0.1, vocab_ids=vocab_ids)
    logits = hidden.reshape(-1, 16) @ weight.t()
    expected = (torch.logsumexp(logits[:, vocab_ids], -1) - logits.gather(1, targets.reshape(-1, 1)).squeeze(1)).sum()
    assert torch.isfinite(nll) and torch.allclose(nll, expected, rtol=1e-5)


def test_a_model_with_a_target_output_vocabulary_scores_only_those_pieces():
    torch.manual_seed(0)
    cfg = ModelConfig(
        d_model=16, heads=2, ffn_dim=32, encoder_layers=1, decoder_layers=1, dropout=0.0, output_vocab="target"
    )
    model = build_model(cfg, 37, 37, PAD, joint_vocab=True)
    allowed = torch.tensor([0, 3, 5, 6, 7, 10, 12, 20, 33, 36])
    assert model.restrict_output(allowed.tolist()) == 10
    src = torch.randint(3, 37, (3, 5))
    tgt_in = torch.randint(3, 37, (3, 4))
    tgt_out = allowed[torch.randint(1, 10, (3, 4))]
    mask = torch.zeros(3, 5, dtype=torch.bool)
    loss, _ = TranslationLoss(model, PAD, 0.1)(src, mask, tgt_in, tgt_out)
    logits = model(src, mask, tgt_in)
    outside = torch.ones(40, dtype=torch.bool)
    outside[allowed] = False
    assert torch.isneginf(logits[..., outside]).all() and torch.isfinite(logits[..., allowed]).all()
    positions = torch.searchsorted(allowed, tgt_out.reshape(-1))
    expected = F.cross_entropy(logits.reshape(-1, 40)[:, allowed], positions, label_smoothing=0.1, reduction="sum")
    assert torch.allclose(loss, expected, rtol=1e-5)
    # the restriction is part of the model's state: a fresh model loading it scores the same
    reloaded = build_model(cfg, 37, 37, PAD, joint_vocab=True)
    reloaded.load_state_dict(model.state_dict())
    assert torch.equal(reloaded.output_ids, allowed)
    assert torch.equal(reloaded(src, mask, tgt_in), logits)


@pytest.mark.parametrize("restricted", [False, True])
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_static_rows_project_the_padding_and_count_nothing_of_it(eps, restricted):
    """static_rows (CUDA graphs: shapes from the batch's shape alone): every position is projected,
    the pad ones weighted 0; loss, NLL and both gradients are those of the selected rows, whatever
    the pad rows hold."""
    hidden, weight, targets = _inputs()
    hidden[3, 1:] = torch.randn(8, 16) * 100  # padding: any values
    vocab_ids = torch.arange(0, 50, 2) if restricted else None
    if restricted:
        targets = torch.where(targets == PAD, PAD, targets - targets % 2)
    results = []
    for static_rows in (False, True):
        h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
        loss, nll = output_loss(h, w, targets, PAD, eps, vocab_ids=vocab_ids, static_rows=static_rows)
        (loss * 0.5).backward()
        results.append((loss, nll, h.grad, w.grad))
    for selected, static in zip(*results, strict=True):
        assert torch.allclose(selected, static, rtol=1e-5, atol=1e-6)
    assert (results[1][2][3, 1:] == 0).all()  # the pad rows get no gradient


@pytest.mark.parametrize("static_rows", [True, False])
def test_compiled_per_shape_the_loss_keeps_its_chunks(static_rows):
    """Compiled per batch shape (shape buckets: static rows, every target position weighted) the
    row count is a constant of each graph, and so is the chunk count: the logits stay chunked
    (5,000 rows x 1,000 pieces in the CPU's 2M-element chunks: 3; 4,000 rows: 2). The non-pad
    rows' count changes every batch: compiled, that takes one chunk (no graph per token count)."""
    torch._dynamo.reset()
    count = torch.compile(
        lambda hidden: hidden.new_full((), loss_module._chunk_count(hidden.shape[0], 1000, hidden, static_rows)),
        backend="eager",
        dynamic=not static_rows,
    )
    assert [int(count(torch.zeros(rows, 4))) for rows in (5000, 4000)] == ([3, 2] if static_rows else [1, 1])
    assert loss_module._chunk_count(5000, 1000, torch.zeros(1), static_rows) == 3  # eager: always chunked
