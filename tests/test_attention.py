"""Attention without masks where none is needed (mtrain.model.attention), and the SDPA backend
report the GPU check prints (mtrain.model.attention_backends)."""

from __future__ import annotations

import pytest
import torch

from mtrain.config import ModelConfig
from mtrain.model import build_model
from mtrain.model.attention import attend, padding_bias
from mtrain.model.attention_backends import MTRAIN_MATH, format_backends, sdpa_backends

VOCAB, PAD = 64, 1


def tiny_model(impl: str) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = ModelConfig(
        d_model=32, heads=4, ffn_dim=64, encoder_layers=2, decoder_layers=2, dropout=0.0, attention_impl=impl
    )
    return build_model(cfg, VOCAB, VOCAB, PAD, joint_vocab=True).train()


def loss_and_grads(model: torch.nn.Module, src_padding_mask: torch.Tensor | None) -> tuple[torch.Tensor, list]:
    generator = torch.Generator().manual_seed(1)
    src = torch.randint(4, VOCAB, (3, 7), generator=generator)
    tgt = torch.randint(4, VOCAB, (3, 6), generator=generator)
    model.zero_grad(set_to_none=True)
    logits = model(src, src_padding_mask, tgt)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.roll(-1, 1).reshape(-1))
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("impl", ["sdpa", "math"])
def test_no_mask_gives_the_all_false_masks_outputs_and_gradients(impl):
    """A batch without source padding runs unmasked (flash-eligible); nothing changes."""
    model = tiny_model(impl)
    masked_loss, masked_grads = loss_and_grads(model, torch.zeros(3, 7, dtype=torch.bool))
    loss, grads = loss_and_grads(model, None)
    torch.testing.assert_close(loss, masked_loss, rtol=1e-6, atol=1e-6)
    assert len(grads) == len(masked_grads) > 0
    for grad, masked_grad in zip(grads, masked_grads, strict=True):
        torch.testing.assert_close(grad, masked_grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("use_sdpa", [True, False])
def test_causal_attention_needs_no_target_padding_mask(use_sdpa):
    """The decoder masks only causally: padded target positions are keys only of padded queries
    (padding comes last), whose rows the loss ignores. Masking them too changes no real row's
    output nor any gradient of a loss over the real rows."""
    generator = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(3, 4, 6, 8, generator=generator, requires_grad=True) for _ in range(3))
    lengths = torch.tensor([6, 4, 2])
    padding = torch.arange(6)[None, :] >= lengths[:, None]  # (batch, tgt_len), True at padding
    real_rows = (~padding)[:, None, :, None].float()  # the loss's weights: real query rows only

    def real_loss_and_grads(bias):
        output, _ = attend(q, k, v, bias, True, 0.0, use_sdpa, need_weights=False)
        loss = (output * real_rows * torch.arange(8.0)).sum()
        return output, torch.autograd.grad(loss, (q, k, v))

    masked_output, masked_grads = real_loss_and_grads(padding_bias(padding))
    output, grads = real_loss_and_grads(None)
    torch.testing.assert_close(output * real_rows, masked_output * real_rows)
    for grad, masked_grad in zip(grads, masked_grads, strict=True):
        torch.testing.assert_close(grad, masked_grad)


def test_backend_report_names_every_attention_call():
    model = tiny_model("sdpa")
    src = torch.randint(4, VOCAB, (3, 7))
    tgt = torch.randint(4, VOCAB, (3, 6))
    padding = torch.zeros(3, 7, dtype=torch.bool)
    padding[0, 5:] = True
    calls = sdpa_backends(model, src, padding, tgt)
    assert [c.module for c in calls] == [
        "encoder.0.self_attn.attention",
        "encoder.1.self_attn.attention",
        "decoder.0.self_attn.attention",
        "decoder.0.cross_attn.attention",
        "decoder.1.self_attn.attention",
        "decoder.1.cross_attn.attention",
    ]
    assert [(c.masked, c.causal) for c in calls] == [(True, False)] * 2 + [(False, True), (True, False)] * 2
    assert all(c.chosen in c.eligible and "MATH" in c.eligible for c in calls)  # the chosen kernel runs
    assert calls[2].shape == (3, 4, 6, 8)
    unpadded = sdpa_backends(model, src, None, tgt)
    assert not any(c.masked for c in unpadded)
    lines = format_backends(calls)
    assert len(lines) == 3 and lines[0].startswith("encoder self-attention: ") and "2 calls; padding mask" in lines[0]
    assert "no mask, causal" in lines[1] and lines[2].startswith("cross-attention: ")


def test_backend_report_says_when_attention_does_not_use_sdpa():
    calls = sdpa_backends(tiny_model("math"), torch.randint(4, VOCAB, (2, 5)), None, torch.randint(4, VOCAB, (2, 4)))
    assert len(calls) == 6 and all(c.chosen == MTRAIN_MATH for c in calls)
