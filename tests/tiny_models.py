"""Tiny models over a few dozen token ids, for the tests of decoding's algorithms: random ones
(`tiny_model`, `search_model`), one trained for seconds on a copy task (`train_to_copy`), random
sources (`source_batch`), the best output by exhaustive search, and a recorder of the host
synchronisations a decode makes."""

from __future__ import annotations

import itertools

import torch

from mtrain.config import ModelConfig
from mtrain.decode.search.hypothesis import length_normalise
from mtrain.model import build_model

UNK, PAD, BOS, EOS = 0, 1, 2, 3
VOCAB = 40


def tiny_model(seed: int = 0, **overrides):
    """A tiny random model over VOCAB tokens (ModelConfig fields in `overrides`), its output
    layer sharpened."""
    torch.manual_seed(seed)
    cfg = ModelConfig(
        **{
            "encoder_layers": 2,
            "decoder_layers": 2,
            "d_model": 32,
            "heads": 4,
            "ffn_dim": 64,
            "dropout": 0.0,
            "max_positions": 128,
            **overrides,
        }
    )
    model = build_model(cfg, VOCAB, VOCAB, PAD, joint_vocab=True).eval()
    with torch.no_grad():
        model.output_proj.weight.mul_(3.0)  # peakier than at init, so EOS comes at varied steps
    return model


def train_to_copy(model, steps: int = 120, seed: int = 0):
    """A few Adam steps on a copy task: enough for EOS to come at varied, sensible steps
    (a random model runs every hypothesis to max length, which tests little)."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        lengths = torch.randint(2, 9, (32,), generator=generator).tolist()
        src = torch.full((32, max(lengths) + 1), PAD)
        tgt_input, labels = src.clone(), src.clone()
        for row, n in enumerate(lengths):
            tokens = torch.randint(4, VOCAB, (n,), generator=generator)
            src[row, : n + 1] = torch.cat([tokens, torch.tensor([EOS])])
            tgt_input[row, : n + 1] = torch.cat([torch.tensor([BOS]), tokens])
            labels[row, : n + 1] = src[row, : n + 1]
        logits = model(src, src.eq(PAD), tgt_input)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=PAD)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def search_model(vocab: int, seed: int = 0, sharpness: float = 3.0):
    """A tiny random model over `vocab` tokens, its output layer scaled by `sharpness`."""
    torch.manual_seed(seed)
    cfg = ModelConfig(
        encoder_layers=1,
        decoder_layers=2,
        d_model=16,
        heads=2,
        ffn_dim=32,
        dropout=0.0,
        vocab_multiple=8,
        max_positions=64,
    )
    model = build_model(cfg, vocab, vocab, PAD, joint_vocab=True).eval()
    with torch.no_grad():  # sharper distributions than the default init: beams disagree more
        model.output_proj.weight.mul_(sharpness)
    return model


def source_batch(lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random sources of these lengths (eos included), right-padded."""
    generator = torch.Generator().manual_seed(seed)
    src = torch.full((len(lengths), max(lengths)), PAD)
    for row, length in enumerate(lengths):
        src[row, : length - 1] = torch.randint(4, VOCAB, (length - 1,), generator=generator)
        src[row, length - 1] = EOS
    return src, src.eq(PAD)


def exhaustive_best(model, src, max_len: int, alpha: float, vocab: int):
    """Best (tokens, normalised score) over every output of 1..max_len tokens + EOS."""
    emittable = [t for t in range(vocab) if t not in (PAD, BOS, EOS)]
    outputs = [list(seq) for n in range(1, max_len + 1) for seq in itertools.product(emittable, repeat=n)]
    width = max_len + 1
    tgt_input = torch.full((len(outputs), width), PAD)
    labels = torch.full((len(outputs), width), PAD)
    for i, y in enumerate(outputs):
        tgt_input[i, : len(y) + 1] = torch.tensor([BOS] + y)
        labels[i, : len(y) + 1] = torch.tensor(y + [EOS])
    with torch.no_grad():
        src_batch = src.expand(len(outputs), -1)
        lprobs = torch.log_softmax(model(src_batch, src_batch.eq(PAD), tgt_input).float(), dim=-1)
    token_lprobs = lprobs.gather(-1, labels.unsqueeze(-1)).squeeze(-1).masked_fill(labels.eq(PAD), 0.0)
    lengths = labels.ne(PAD).sum(dim=1)
    scores = length_normalise(token_lprobs.sum(dim=1), lengths, alpha)
    best = int(scores.argmax())
    return outputs[best], float(scores[best]), scores


HOST_SYNCS = ("item", "tolist", "cpu", "numpy", "nonzero", "__bool__", "__int__", "__float__")


def record_host_syncs(monkeypatch, model) -> list[str]:
    """A list that records, in order, each host synchronisation (HOST_SYNCS) and each of
    `model`'s decoding steps ("step") from here on."""
    events: list[str] = []
    for name in HOST_SYNCS:
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(
            torch.Tensor,
            name,
            lambda self, *a, _original=original, _name=name, **k: events.append(_name) or _original(self, *a, **k),
        )
    decode_step = model.decode_step
    monkeypatch.setattr(model, "decode_step", lambda *a, **k: events.append("step") or decode_step(*a, **k))
    return events
