"""Tests for mtrain.model: masking, residual/norm placement, every ablation switch,
cached decoding against the full forward pass, FLOPs accounting, instruments, and two tiny
tasks (copy, reversal) that a working encoder-decoder must learn."""

from __future__ import annotations

import math
import time

import pytest
import torch
import torch.nn.functional as F

from mtrain.config import ModelConfig
from mtrain.errors import MtrainError
from mtrain.model import Seq2SeqTransformer, StatisticsRecorder, build_model
from mtrain.model.dropout import dropout, dropout_add
from mtrain.model.layers import DecoderLayer, EncoderLayer
from mtrain.model.variants import VariantDecoderLayer, VariantEncoderLayer

PAD, BOS, EOS = 1, 2, 3
VOCAB = 21  # padded to 24 rows by vocab_multiple=8


def tiny(**overrides) -> ModelConfig:
    settings = dict(d_model=32, heads=4, ffn_dim=64, layers=2, dropout=0.0, max_positions=64)
    settings.update(overrides)
    return ModelConfig(**settings)


def build(
    cfg: ModelConfig, src_vocab: int = VOCAB, tgt_vocab: int = VOCAB, seed: int = 0, joint: bool | None = None
) -> Seq2SeqTransformer:
    """The model for `cfg`; the vocabulary is joint when not said otherwise and sizes are equal."""
    torch.manual_seed(seed)
    return build_model(cfg, src_vocab, tgt_vocab, PAD, joint_vocab=src_vocab == tgt_vocab if joint is None else joint)


def batch(batch_size: int = 3, src_len: int = 7, tgt_len: int = 6, seed: int = 1):
    """src with padding at the end of rows 1 and 2, and a teacher-forced target input."""
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(4, VOCAB, (batch_size, src_len), generator=generator)
    lengths = torch.tensor([src_len, src_len - 2, src_len - 4][:batch_size])
    padding = torch.arange(src_len)[None, :] >= lengths[:, None]
    src = src.masked_fill(padding, PAD)
    tgt = torch.randint(4, VOCAB, (batch_size, tgt_len), generator=generator)
    tgt[:, 0] = BOS
    return src, padding, tgt


# Switch combinations that change the computation; cached decoding must match each.
VARIANTS = [
    {},
    {"norm_position": "post"},
    {"norm_position": "post", "final_norm": True},
    {"residual_input": "normalized"},
    {"positions": "rope"},
    {"positions": "learned"},
    {"positions": "none"},
    {"cross_q_proj": False, "cross_k_proj": False, "cross_v_proj": False},
    {"cross_k_proj": False},
    {"decoder_order": "cross_self_ffn"},
    {"decoder_order": "self_ffn_cross"},
    {"activation": "swiglu", "norm_type": "rmsnorm", "shared_norm": True},
    {"activation": "gelu", "final_norm": False, "scale_embeddings": False},
    {"attention_impl": "sdpa"},
    {"tie_embeddings": False},
    {"cross_q_proj": False},
    {"cross_v_proj": False},
    {"norm_type": "rmsnorm"},
    {"shared_norm": True},
    {"activation": "swiglu"},
    {"detach_memory": True},
    {"norm_position": "post", "decoder_order": "cross_self_ffn", "shared_norm": True},
    {"residual_input": "normalized", "decoder_order": "self_ffn_cross", "norm_type": "rmsnorm"},
    {"positions": "rope", "cross_q_proj": False, "activation": "swiglu", "attention_impl": "sdpa"},
]


def variant_id(variant: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in variant.items()) or "default"


# ----------------------------------------------------------------------------- masking
@pytest.mark.parametrize(
    "variant",
    [{}, {"positions": "rope"}, {"attention_impl": "sdpa"}, {"decoder_order": "cross_self_ffn"}],
    ids=variant_id,
)
def test_causal_mask_hides_later_target_tokens(variant):
    model = build(tiny(**variant)).eval()
    src, padding, tgt = batch()
    logits = model(src, padding, tgt)
    for t in range(tgt.shape[1] - 1):
        changed = tgt.clone()
        changed[:, t + 1 :] = torch.randint(4, VOCAB, changed[:, t + 1 :].shape)
        other = model(src, padding, changed)
        torch.testing.assert_close(other[:, : t + 1, :VOCAB], logits[:, : t + 1, :VOCAB], rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "variant", [{}, {"positions": "learned"}, {"attention_impl": "sdpa"}, {"norm_position": "post"}], ids=variant_id
)
def test_source_padding_content_is_ignored(variant):
    model = build(tiny(**variant)).eval()
    src, padding, tgt = batch()
    logits = model(src, padding, tgt)
    memory = model.encode(src, padding)
    scrambled = src.masked_scatter(padding, torch.randint(4, VOCAB, (int(padding.sum()),)))
    assert not torch.equal(scrambled, src)
    torch.testing.assert_close(model(scrambled, padding, tgt), logits, rtol=0, atol=1e-6)
    torch.testing.assert_close(model.encode(scrambled, padding)[~padding], memory[~padding], rtol=0, atol=1e-6)


# ----------------------------------------------------------------------------- residuals and norms
def test_pre_norm_residual_adds_the_unnormalized_input():
    cfg = tiny()
    layer = build(cfg).encoder[0]
    x = torch.randn(2, 5, cfg.d_model) * 3 + 1  # far from normalised on purpose
    bias = torch.zeros(2, 1, 1, 5)
    # A sublayer that outputs zero leaves the stream untouched: no norm on the residual path.
    layer.self_attn.forward = lambda h, **_: torch.zeros_like(h)
    layer.ffn.forward = torch.zeros_like
    torch.testing.assert_close(layer(x, bias), x, rtol=0, atol=0)


def test_pre_norm_layer_matches_hand_formula():
    cfg = tiny()
    layer = build(cfg).encoder[0].eval()
    x = torch.randn(2, 5, cfg.d_model)
    bias = torch.zeros(2, 1, 1, 5)
    h = x + layer.self_attn(layer.self_attn_norm(x), bias=bias)
    expected = h + layer.ffn(layer.ffn_norm(h))
    torch.testing.assert_close(layer(x, bias), expected)


def test_post_norm_layer_matches_hand_formula():
    cfg = tiny(norm_position="post")
    layer = build(cfg).encoder[0].eval()
    x = torch.randn(2, 5, cfg.d_model)
    bias = torch.zeros(2, 1, 1, 5)
    h = layer.self_attn_norm(x + layer.self_attn(x, bias=bias))
    expected = layer.ffn_norm(h + layer.ffn(h))
    torch.testing.assert_close(layer(x, bias), expected)


def test_normalized_residual_layer_matches_hand_formula():
    cfg = tiny(residual_input="normalized")
    layer = build(cfg).decoder[0].eval()
    x = torch.randn(2, 5, cfg.d_model) * 3 + 1
    memory = torch.randn(2, 4, cfg.d_model)
    keys, values = layer.cross_attn.project_memory(memory)
    bias = torch.zeros(2, 1, 1, 4)
    n = layer.self_attn_norm(x)
    h = n + layer.self_attn(n, causal=True)
    n = layer.cross_attn_norm(h)
    h = n + layer.cross_attn(n, keys, values, bias, False)[0]
    n = layer.ffn_norm(h)
    expected = n + layer.ffn(n)
    torch.testing.assert_close(layer(x, keys, values, bias)[0], expected)
    # A zero sublayer now normalises the stream instead of leaving it untouched.
    layer.self_attn.forward = lambda h, **_: torch.zeros_like(h)
    layer.cross_attn.forward = lambda h, *args: (torch.zeros_like(h), None)
    layer.ffn.forward = torch.zeros_like
    out = layer(x, keys, values, bias)[0]
    torch.testing.assert_close(out.mean(-1), torch.zeros(2, 5), rtol=0, atol=1e-5)


def test_standard_decoder_layer_matches_hand_formula():
    # x + SA(LN1 x); x + CA(LN2 x, memory); x + FFN(LN3 x), each sublayer with its own norm.
    cfg = tiny()
    layer = build(cfg).decoder[0].eval()
    assert type(layer) is DecoderLayer
    x = torch.randn(2, 5, cfg.d_model) * 3 + 1
    memory = torch.randn(2, 4, cfg.d_model)
    bias = torch.zeros(2, 1, 1, 4).masked_fill(torch.tensor([False, False, True, True]), float("-inf"))
    keys, values = layer.cross_attn.project_memory(memory)
    expected = x + layer.self_attn(layer.self_attn_norm(x), causal=True)
    expected = expected + layer.cross_attn(layer.cross_attn_norm(expected), keys, values, bias)[0]
    expected = expected + layer.ffn(layer.ffn_norm(expected))
    torch.testing.assert_close(layer(x, keys, values, bias)[0], expected, rtol=0, atol=0)


LAYER_CLASSES = [
    ({}, EncoderLayer, DecoderLayer),
    (
        {"shared_norm": True, "norm_type": "rmsnorm", "activation": "swiglu", "cross_q_proj": False},
        EncoderLayer,
        DecoderLayer,
    ),
    ({"norm_position": "post"}, VariantEncoderLayer, VariantDecoderLayer),
    ({"residual_input": "normalized"}, VariantEncoderLayer, VariantDecoderLayer),
    ({"decoder_order": "cross_self_ffn"}, EncoderLayer, VariantDecoderLayer),
]


@pytest.mark.parametrize("variant, encoder, decoder", LAYER_CLASSES, ids=[variant_id(v) for v, _, _ in LAYER_CLASSES])
def test_ablations_are_built_around_the_standard_layers(variant, encoder, decoder):
    model = build(tiny(**variant))
    assert type(model.encoder[0]) is encoder and type(model.decoder[0]) is decoder
    # A variant connects the standard layer's sublayers differently: same parameters, same names.
    standard = build(
        tiny(**{k: v for k, v in variant.items() if k not in ("norm_position", "residual_input", "decoder_order")})
    )
    for stack in ("encoder", "decoder"):
        shapes = {n: p.shape for n, p in getattr(model, stack).state_dict().items()}
        assert shapes == {n: p.shape for n, p in getattr(standard, stack).state_dict().items()}


def test_normalized_residual_needs_pre_norm():
    with pytest.raises(MtrainError, match="model.residual_input"):
        build(tiny(residual_input="normalized", norm_position="post"))
    with pytest.raises(MtrainError, match="model.residual_input"):
        build(tiny(residual_input="normalised"))


def test_post_norm_has_no_final_norm_unless_asked():
    assert build(tiny(norm_position="post")).decoder_norm is None
    assert build(tiny(norm_position="post", final_norm=True)).decoder_norm is not None
    assert build(tiny()).encoder_norm is not None
    assert build(tiny(final_norm=False)).encoder_norm is None


def _norms(layer: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in layer.modules() if isinstance(m, (torch.nn.LayerNorm, torch.nn.RMSNorm))]


def test_each_sublayer_owns_its_norm():
    model = build(tiny())
    decoder_layer, encoder_layer = model.decoder[0], model.encoder[0]
    assert len(_norms(decoder_layer)) == 3 and len(_norms(encoder_layer)) == 2
    norms = [decoder_layer.self_attn_norm, decoder_layer.cross_attn_norm, decoder_layer.ffn_norm]
    assert len({id(n) for n in norms}) == 3
    assert encoder_layer.self_attn_norm is not encoder_layer.ffn_norm


@pytest.mark.parametrize("norm_type", ["layernorm", "rmsnorm"])
def test_shared_norm_is_one_module_per_layer(norm_type):
    model = build(tiny(shared_norm=True, norm_type=norm_type))
    layer = model.decoder[0]
    assert layer.self_attn_norm is layer.cross_attn_norm is layer.ffn_norm
    assert len(_norms(layer)) == 1  # modules() deduplicates: one module object
    assert model.encoder[0].self_attn_norm is model.encoder[0].ffn_norm
    assert model.encoder[0].self_attn_norm is not model.encoder[1].self_attn_norm


# ----------------------------------------------------------------------------- ablation switches
@pytest.mark.parametrize(
    "variant",
    VARIANTS
    + [
        {"activation": "relu", "norm_type": "rmsnorm"},
        {"activation": "swiglu", "positions": "rope", "decoder_order": "self_ffn_cross"},
        {"detach_memory": True},
        {"attention_dropout": 0.1, "activation_dropout": 0.1, "dropout": 0.1},
    ],
    ids=variant_id,
)
def test_every_switch_runs_forward_and_backward(variant):
    model = build(tiny(**variant)).train()
    src, padding, tgt = batch()
    logits = model(src, padding, tgt)
    assert logits.shape == (3, 6, 24)
    loss = F.cross_entropy(logits[..., :VOCAB].reshape(-1, VOCAB), tgt.roll(-1, 1).reshape(-1))
    loss.backward()
    assert torch.isfinite(loss)
    grads = [p.grad for p in model.decoder.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_detach_memory_stops_gradient_at_the_encoder():
    src, padding, tgt = batch()
    for detach in (True, False):
        model = build(tiny(detach_memory=detach))
        model(src, padding, tgt).logsumexp(-1).sum().backward()
        encoder_params = list(model.encoder.parameters()) + list(model.encoder_norm.parameters())
        norms = [0.0 if p.grad is None else p.grad.abs().sum().item() for p in encoder_params]
        if detach:
            assert all(n == 0.0 for n in norms)
        else:
            assert all(n > 0.0 for n in norms)


def test_identity_cross_projections_do_not_exist_and_match_hand_formula():
    cfg = tiny(cross_q_proj=False, cross_k_proj=False, cross_v_proj=False)
    model = build(cfg)
    names = [name for name, _ in model.named_parameters()]
    assert not any("cross_attn.q_proj" in n or "cross_attn.k_proj" in n or "cross_attn.v_proj" in n for n in names)
    assert any("cross_attn.out_proj" in n for n in names)
    attention = model.decoder[0].cross_attn.eval()
    x, memory = torch.randn(2, 3, 32), torch.randn(2, 4, 32)
    padding = torch.tensor([[False] * 4, [False, False, True, True]])
    bias = torch.zeros(2, 4).masked_fill(padding, float("-inf"))
    keys, values = attention.project_memory(memory)
    output, weights = attention(x, keys, values, bias[:, None, None, :], need_weights=True)
    # By hand: per head h (8 dims each), softmax(x_h m_h^T / sqrt(8) + mask) m_h, then W_O.
    heads = []
    for h in range(4):
        xh, mh = x[..., h * 8 : (h + 1) * 8], memory[..., h * 8 : (h + 1) * 8]
        probabilities = torch.softmax(xh @ mh.transpose(1, 2) / math.sqrt(8) + bias[:, None, :], dim=-1)
        torch.testing.assert_close(weights[:, h], probabilities)  # every head's weights, (batch, tgt, src)
        heads.append(probabilities @ mh)
    expected = attention.out_proj(torch.cat(heads, dim=-1))
    torch.testing.assert_close(output, expected)
    assert weights.shape == (2, 4, 3, 4) and torch.all(weights[1, :, :, 2:] == 0)


def test_tied_embeddings():
    joint = build(tiny(), joint=True)
    assert joint.src_embed.tokens.weight is joint.tgt_embed.tokens.weight is joint.output_proj.weight
    separate = build(tiny(), src_vocab=30, tgt_vocab=VOCAB, joint=False)
    assert separate.tgt_embed.tokens.weight is separate.output_proj.weight
    assert separate.src_embed.tokens.weight is not separate.tgt_embed.tokens.weight
    assert separate.src_embed.tokens.weight.shape == (32, 32)  # 30 rows padded to 32
    untied = build(tiny(tie_embeddings=False))
    weights = {id(untied.src_embed.tokens.weight), id(untied.tgt_embed.tokens.weight), id(untied.output_proj.weight)}
    assert len(weights) == 3


def test_separate_vocabularies_of_equal_size_are_not_tied():
    # tokenizer.joint=false: id 200 is one piece in the source and another in the target.
    model = build(tiny(), joint=False)
    assert model.src_embed.tokens.weight is not model.tgt_embed.tokens.weight
    assert model.tgt_embed.tokens.weight is model.output_proj.weight
    names = dict(model.named_parameters())  # named_parameters lists a shared tensor once
    assert "src_embed.tokens.weight" in names and "tgt_embed.tokens.weight" in names
    with pytest.raises(ValueError, match="joint vocabulary"):
        build(tiny(), src_vocab=30, tgt_vocab=VOCAB, joint=True)


def test_padded_vocabulary_rows_get_minus_infinity():
    model = build(tiny()).eval()
    src, padding, tgt = batch()
    logits = model(src, padding, tgt)
    assert logits.shape[-1] == 24
    assert torch.isinf(logits[..., VOCAB:]).all() and (logits[..., VOCAB:] < 0).all()
    assert torch.isfinite(logits[..., :VOCAB]).all()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.isneginf(model(src, padding, tgt)[..., VOCAB:]).all()


def test_initialisation():
    model = build(tiny(d_model=64, heads=4), src_vocab=400, tgt_vocab=400)
    embedding = model.src_embed.tokens.weight
    assert torch.all(embedding[PAD] == 0)
    assert abs(embedding.std().item() - 64**-0.5) < 0.01
    q = model.encoder[0].self_attn.q_proj
    bound = math.sqrt(6 / (64 + 64))  # xavier uniform
    assert q.weight.abs().max() <= bound and q.weight.abs().max() > 0.9 * bound
    assert torch.all(q.bias == 0)


def test_layers_sets_both_stacks():
    model = build(tiny(layers=3, encoder_layers=1, decoder_layers=5))
    assert len(model.encoder) == 3 and len(model.decoder) == 3
    model = build(tiny(layers=None, encoder_layers=1, decoder_layers=2))
    assert len(model.encoder) == 1 and len(model.decoder) == 2


@pytest.mark.parametrize(
    "key, value",
    [
        ("activation", "foo"),
        ("norm_position", "middle"),
        ("norm_type", "batchnorm"),
        ("positions", "alibi"),
        ("decoder_order", "ffn_self_cross"),
        ("attention_impl", "flash"),
        ("heads", 5),
        ("dropout", 1.0),
        ("d_model", 0),
        ("layers", 0),
    ],
)
def test_invalid_values_name_the_key(key, value):
    with pytest.raises(MtrainError, match=f"model.{key}"):
        build(tiny(**{key: value}))


def test_invalid_activation_message():
    with pytest.raises(MtrainError, match=r"model.activation: 'foo' is not one of relu\|gelu\|silu\|swiglu"):
        build(tiny(activation="foo"))


def test_sequence_longer_than_max_positions_is_a_clear_error():
    model = build(tiny(max_positions=5))
    src, padding, tgt = batch()
    with pytest.raises(MtrainError, match="model.max_positions"):
        model(src, padding, tgt)


# ----------------------------------------------------------------------------- incremental decoding
def decode_all(model: Seq2SeqTransformer, src, padding, tgt, **kwargs):
    state = model.start_decoding(model.encode(src, padding), padding)
    return torch.stack([model.decode_step(tgt[:, t], state, **kwargs) for t in range(tgt.shape[1])], dim=1)


@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
def test_cached_decoding_equals_full_forward(variant):
    model = build(tiny(**variant)).eval()
    src, padding, tgt = batch()
    with torch.no_grad():
        full = model(src, padding, tgt)
        cached = decode_all(model, src, padding, tgt)
    torch.testing.assert_close(cached[..., :VOCAB], full[..., :VOCAB], rtol=0, atol=1e-5)
    assert torch.isneginf(cached[..., VOCAB:]).all()


def test_cross_attention_weights_from_decode_step():
    model = build(tiny(layers=3)).eval()
    src, padding, tgt = batch()
    state = model.start_decoding(model.encode(src, padding), padding)
    logits, weights = model.decode_step(tgt[:, 0], state, need_attention=True)
    assert logits.shape == (3, 24) and weights.shape == (3, 7)
    torch.testing.assert_close(weights.sum(-1), torch.ones(3))
    assert torch.all(weights[padding] == 0)
    _, every = model.decode_step(tgt[:, 1], state, need_attention=True, attention_layer="all")
    assert every.shape == (3, 3, 7)
    _, first = model.decode_step(tgt[:, 2], state, need_attention=True, attention_layer=0)
    assert first.shape == (3, 7) and state.step == 3
    with pytest.raises(MtrainError, match="attention_layer"):
        model.decode_step(tgt[:, 3], state, need_attention=True, attention_layer=7)


@pytest.mark.parametrize("variant", [{}, {"positions": "rope"}], ids=variant_id)
def test_reorder_then_step_equals_step_on_reordered_inputs(variant):
    model = build(tiny(**variant)).eval()
    src, padding, tgt = batch()
    index = torch.tensor([2, 0, 0])  # beam-style: a row repeated, a row dropped
    with torch.no_grad():
        state = model.start_decoding(model.encode(src, padding), padding)
        for t in range(3):
            model.decode_step(tgt[:, t], state)
        state.reorder(index)
        after_reorder = model.decode_step(tgt[index, 3], state)
        expected = decode_all(model, src[index], padding[index], tgt[index, :4])[:, 3]
        torch.testing.assert_close(after_reorder, expected, rtol=0, atol=1e-5)
        state.reorder(torch.tensor([1]))  # shrink: finished sentences dropped
        assert model.decode_step(tgt[index[1:2], 4], state).shape == (1, 24)


# ----------------------------------------------------------------------------- FLOPs
def test_flops_per_token_matches_hand_count():
    cfg = ModelConfig(d_model=8, heads=2, ffn_dim=16, encoder_layers=1, decoder_layers=1)
    model = build_model(cfg, 16, 16, PAD, joint_vocab=True)  # 16 rows already a multiple of 8
    S, T, d = 5, 4, 8
    encoder = S * 2 * (4 * d * d + 2 * d * 16) + 4 * S * S * d  # W_QKVO + FFN, then QK^T and AV
    decoder = T * 2 * (4 * d * d + 2 * d * d + 2 * d * 16)  # self W_QKVO, cross W_Q W_O, FFN
    decoder += S * 2 * (2 * d * d)  # cross W_K W_V on the memory, once per source token
    decoder += 4 * T * T * d + 4 * T * S * d  # self and cross QK^T, AV
    output = T * 2 * d * 16
    assert encoder + decoder + output == 14496
    assert model.flops_per_token(S, T) == 3 * 14496 / T
    no_kv = build_model(
        ModelConfig(
            d_model=8, heads=2, ffn_dim=16, encoder_layers=1, decoder_layers=1, cross_k_proj=False, cross_v_proj=False
        ),
        16,
        16,
        PAD,
        joint_vocab=True,
    )
    assert no_kv.flops_per_token(S, T) == 3 * (14496 - S * 2 * 2 * d * d) / T


def test_benchmark_model_size():
    model = build_model(ModelConfig(), 8000, 8000, PAD, joint_vocab=True)
    assert sum(p.numel() for p in model.parameters()) == 7_578_624  # the 7.58M of BENCHMARK.md


# ----------------------------------------------------------------------------- instruments
def test_statistics_recorder_records_one_forward_then_stops():
    model = build(tiny(layers=3)).train()
    src, padding, tgt = batch()
    recorder = StatisticsRecorder(model)
    model(src, padding, tgt)
    assert recorder.statistics == {}
    recorder.arm()
    model(src, padding, tgt)
    stats = dict(recorder.statistics)
    for name in (
        "encoder.0.self_attn.input_std",
        "encoder.2.ffn.input_mean",
        "decoder.2.cross_attn.entropy",
        "decoder.1.self_attn.entropy",
        "decoder.1.residual_std",
        "encoder.0.residual_mean",
        "decoder.0.ffn.output_std",
    ):
        assert name in stats and math.isfinite(stats[name]), name
    assert 0.0 < stats["decoder.2.cross_attn.entropy"] <= math.log(7) + 1e-6
    assert not recorder.armed
    model(src, padding, tgt)
    assert recorder.statistics == stats  # the hooks are gone
    assert all(not hook for m in model.modules() for hook in (m._forward_hooks, m._forward_pre_hooks))


def test_attention_entropy_by_hand_and_with_the_fused_kernel():
    src, padding, tgt = batch()
    stats = {}
    for impl in ("math", "sdpa"):  # sdpa never returns probabilities: the hook recomputes them
        model = build(tiny(attention_impl=impl)).eval()
        recorder = StatisticsRecorder(model)
        recorder.arm()
        model(src, padding, tgt)
        stats[impl] = recorder.statistics
    assert stats["math"].keys() == stats["sdpa"].keys()
    for name, value in stats["math"].items():
        assert stats["sdpa"][name] == pytest.approx(value, rel=1e-4, abs=1e-6), name
    # By hand, layer 0's cross-attention: the mean over batch, heads and queries of -sum p log p.
    model = build(tiny()).eval()
    layer = model.decoder[0]
    memory = model.encode(src, padding)
    embedded = model.tgt_embed(tgt)
    x = embedded + layer.self_attn(layer.self_attn_norm(embedded), causal=True)
    q = layer.cross_attn.q_proj(layer.cross_attn_norm(x)).view(3, 6, 4, 8).transpose(1, 2)
    k = layer.cross_attn.k_proj(memory).view(3, 7, 4, 8).transpose(1, 2)
    scores = q @ k.transpose(-1, -2) / math.sqrt(8) + torch.zeros(3, 7).masked_fill(padding, -math.inf)[:, None, None]
    p = torch.softmax(scores, -1)
    expected = -(p * torch.log(p.clamp_min(1e-30))).sum(-1).mean().item()
    assert stats["math"]["decoder.0.cross_attn.entropy"] == pytest.approx(expected, rel=1e-5)


def test_gradient_norm_groups():
    model = build(tiny(layers=2, cross_v_proj=False))
    groups = model.gradient_norm_groups()
    for name in (
        "encoder.embeddings",
        "decoder.embeddings",
        "encoder.0",
        "encoder.1",
        "decoder.1",
        "decoder.0.cross_attn.k_proj",
        "decoder.1.cross_attn.q_proj",
        "encoder_norm",
        "decoder_norm",
    ):
        assert groups[name], name
    assert "decoder.0.cross_attn.v_proj" not in groups
    assert groups["decoder.0.cross_attn.k_proj"][0] is model.decoder[0].cross_attn.k_proj.weight
    covered = {id(p) for params in groups.values() for p in params}
    assert covered == {id(p) for p in model.parameters()}


# ----------------------------------------------------------------------------- dropout
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dropout_keeps_expectation_and_is_reproducible(dtype):
    x = torch.ones(400_000, dtype=dtype)
    torch.manual_seed(3)
    y = dropout(x, 0.1, training=True)
    torch.manual_seed(3)
    assert torch.equal(y, dropout(x, 0.1, training=True))
    kept = (y != 0).float().mean().item()
    assert abs(kept - 0.9) < 0.003
    assert abs(y.float().mean().item() - 1.0) < 0.01
    assert dropout(x, 0.1, training=False) is x


def test_dropout_add_gradients():
    x = torch.randn(64, 32, requires_grad=True)
    y = torch.randn(64, 32, requires_grad=True)
    torch.manual_seed(0)
    out = dropout_add(x, y, 0.3, training=True)
    kept = (out - x).detach() != 0
    out.backward(torch.ones_like(out))
    assert torch.equal(x.grad, torch.ones_like(x))
    torch.testing.assert_close(y.grad, kept.float() / (1 - round(0.3 * 2**16) / 2**16))


def test_training_forward_compiles_on_cpu_without_graph_breaks():
    """The CPU dropout's cheap mask (an in-place `random_`) cannot be traced; under
    torch.compile the model must use `F.dropout`, which inductor fuses, or every sublayer
    splits the graph and runs eagerly (train.compile=true on a CPU)."""
    from mtrain.train.loss import TranslationLoss

    network = TranslationLoss(build(tiny(dropout=0.2, positions="rope", activation="swiglu")), PAD, 0.1).train()
    src, padding, tgt = batch()
    labels = tgt.roll(-1, dims=1)  # the trainer passes the batch's target count, as here
    explanation = torch._dynamo.explain(network)(src, padding, tgt, labels, int((labels != PAD).sum()))
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


# ----------------------------------------------------------------------------- learning
def _task_batch(task: str, size: int, generator: torch.Generator):
    """Random sequences over 10 symbols (ids 4..13), length 3..8; target = copy or reversal."""
    lengths = torch.randint(3, 9, (size,), generator=generator)
    src_len = int(lengths.max()) + 1
    symbols = torch.randint(4, 14, (size, src_len), generator=generator)
    positions = torch.arange(src_len)[None, :]
    src = torch.where(positions < lengths[:, None], symbols, PAD)
    src[torch.arange(size), lengths] = EOS
    if task == "reverse":
        index = (lengths[:, None] - 1 - positions).clamp(min=0)
        y = torch.where(positions < lengths[:, None], symbols.gather(1, index), PAD)
    else:
        y = torch.where(positions < lengths[:, None], symbols, PAD)
    tgt_output = y.clone()
    tgt_output[torch.arange(size), lengths] = EOS
    tgt_input = torch.cat([torch.full((size, 1), BOS), y[:, :-1]], dim=1)
    tgt_input = tgt_input.masked_fill(positions > lengths[:, None], PAD)
    return src, src == PAD, tgt_input, tgt_output


def _greedy(model: Seq2SeqTransformer, src, padding, max_len: int) -> torch.Tensor:
    state = model.start_decoding(model.encode(src, padding), padding)
    tokens = torch.full((src.shape[0],), BOS)
    out = []
    for _ in range(max_len):
        tokens = model.decode_step(tokens, state).argmax(-1)
        out.append(tokens)
    return torch.stack(out, dim=1)


@pytest.mark.parametrize("task", ["copy", "reverse"])
def test_tiny_model_learns_task(task):
    # One thread: for a model this small, a second thread only adds synchronisation (and on
    # a busy machine, waiting for it); 200 steps take ~6 s of CPU. (Exact match after 200 steps:
    # copy 0.985, reverse 0.99; after 150: 0.94 and 0.88.)
    torch.set_num_threads(1)
    start = time.perf_counter()
    steps, warmup = 200, 20
    cfg = ModelConfig(d_model=64, heads=4, ffn_dim=128, layers=2, dropout=0.0, max_positions=16)
    torch.manual_seed(0)
    model = build_model(cfg, 14, 14, PAD, joint_vocab=True).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.98))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min((step + 1) / warmup, (steps - step) / (steps - warmup))
    )
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        src, padding, tgt_input, tgt_output = _task_batch(task, 64, generator)
        logits = model(src, padding, tgt_input)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt_output.reshape(-1), ignore_index=PAD)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    model.eval()
    src, padding, _, tgt_output = _task_batch(task, 200, torch.Generator().manual_seed(99))
    with torch.no_grad():
        predicted = _greedy(model, src, padding, tgt_output.shape[1])
    exact = ((predicted == tgt_output) | (tgt_output == PAD)).all(dim=1).float().mean().item()
    assert exact >= 0.95, f"{task}: exact match {exact:.3f} after {time.perf_counter() - start:.1f}s"
