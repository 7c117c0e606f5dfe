"""The torch decoding engine: low-precision weights cast once, decoding as autocast does.
(Which precision `auto` decodes in: tests/test_runtime.py.)"""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn
from torch.profiler import profile

from mtrain.config import DecodeConfig, ModelConfig
from mtrain.decode.engines import torch_engine
from mtrain.decode.engines.torch_engine import TorchEngine, with_linear_weights_in
from mtrain.decode.search.generator import generate
from mtrain.model import build_model

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny models

PAD, BOS, EOS = 1, 2, 3


def tiny_model():
    torch.manual_seed(0)
    cfg = ModelConfig(
        encoder_layers=1, decoder_layers=2, d_model=32, heads=4, ffn_dim=64, dropout=0.0, max_positions=64
    )
    return build_model(cfg, 40, 40, PAD, joint_vocab=True)  # tied output projection and embeddings


def test_bf16_engine_decodes_as_autocast_does_and_leaves_the_model_alone():
    model = tiny_model().train()
    sources = [[5, 9, 12, 7, EOS], [8, 8, 30, EOS], [11, EOS]]
    cfg = DecodeConfig(beam=3, nbest=2, max_len_a=1.0, max_len_b=3)
    engine = TorchEngine(model, PAD, BOS, EOS, "cpu", "bf16")
    got = engine.translate_batch(sources, cfg)

    src = torch.full((3, 5), PAD)
    for row, ids in enumerate(sources):
        src[row, : len(ids)] = torch.tensor(ids)
    model.eval()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = generate(model, src, src.eq(PAD), cfg, BOS, EOS, PAD)
    assert [[(h.tokens, h.score) for h in s] for s in got] == [[(h.tokens, h.score) for h in s] for s in expected]
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert model.output_proj.weight is model.tgt_embed.tokens.weight  # still tied


def test_low_precision_copy_casts_only_the_activations_at_each_step():
    """Under inference_mode autocast does not cache weight casts: a Linear call casts its input,
    weight and bias. With the weights cast once, only the input is."""
    model = tiny_model()
    decoding = with_linear_weights_in(model, torch.bfloat16)
    assert decoding.output_proj.weight.dtype == torch.bfloat16
    assert decoding.tgt_embed.tokens.weight.dtype == torch.float32
    assert decoding.tgt_embed.tokens.weight is model.tgt_embed.tokens.weight  # shared, not copied
    x = torch.randn(4, 32)

    def casts(linear: nn.Linear) -> int:
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16), profile() as prof:
            linear(x)
        return sum(event.count for event in prof.key_averages() if event.key == "aten::_to_copy")

    assert casts(model.decoder[0].cross_attn.out_proj) == 3
    assert casts(decoding.decoder[0].cross_attn.out_proj) == 1


def test_the_engine_decodes_with_the_attention_kernels_chosen_for_decoding(monkeypatch):
    """generate runs inside `decoding_attention_kernels(device)` (no cuDNN attention on CUDA,
    whose plan per new shape made bf16 decoding 18x slower than fp32 on an H200)."""
    entered = []

    @contextlib.contextmanager
    def recording(device):
        entered.append(device)
        yield

    monkeypatch.setattr(torch_engine, "decoding_attention_kernels", recording)
    engine = TorchEngine(tiny_model(), PAD, BOS, EOS, "cpu", "bf16")
    engine.translate_batch([[5, 9, EOS]], DecodeConfig(beam=2, nbest=1, max_len_a=1.0, max_len_b=2))
    assert entered == [torch.device("cpu")]
