"""mtrain.batches.buckets: a few fixed batch shapes, the least padding for their number, and
a loss that the padding does not change."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mtrain.batches.batching import TokenBatchSampler, collate
from mtrain.batches.buckets import batch_shapes, bucket_of, bucket_widths, pair_widths
from mtrain.batches.corpus import EncodedCorpus
from mtrain.config import ModelConfig
from mtrain.model import build_model
from mtrain.train.loss import TranslationLoss
from tests.synthetic_training import synthetic_trainer

PAD, BOS, EOS = 1, 2, 3


def random_corpus(n: int, seed: int = 0, max_len: int = 40) -> EncodedCorpus:
    rng = np.random.default_rng(seed)
    sources = [list(rng.integers(4, 50, rng.integers(1, max_len))) + [EOS] for _ in range(n)]
    targets = [list(rng.integers(4, 50, rng.integers(1, max_len))) for _ in range(n)]
    return EncodedCorpus.from_sequences(sources, targets)


def padding(widths: np.ndarray, ladder: np.ndarray) -> int:
    return int((bucket_of(widths, ladder) - widths).sum())


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(1, 30), min_size=1, max_size=60),
    st.integers(1, 5),
    st.integers(1, 3),
)
def test_bucket_widths_pad_least_of_all_choices_of_that_many(widths, buckets, multiple):
    widths = np.asarray(widths)
    ladder = bucket_widths(widths, buckets, multiple)
    rounded = -(-widths // multiple) * multiple
    candidates = np.unique(rounded)
    assert len(ladder) <= buckets and ladder[-1] == candidates[-1] and np.all(ladder % multiple == 0)
    assert np.all(np.diff(ladder) > 0)
    best = min(
        padding(rounded, np.asarray([*chosen, candidates[-1]]))
        for size in range(min(buckets, len(candidates)))
        for chosen in itertools.combinations(candidates[:-1], size)
    )
    assert padding(rounded, ladder) == best


def test_a_pair_past_the_ladder_keeps_its_own_rounded_width():
    assert bucket_of(np.asarray([3, 9, 10, 11]), np.asarray([4, 10]), multiple=4).tolist() == [4, 10, 10, 12]


def bucketed_sampler(corpus: EncodedCorpus, buckets: int, max_tokens: int, **options) -> TokenBatchSampler:
    ladder = bucket_widths(pair_widths(corpus.src_lengths, corpus.tgt_lengths), buckets)
    return TokenBatchSampler(
        corpus.src_lengths, corpus.tgt_lengths, max_tokens, seed=3, bucket_widths=ladder, **options
    )


def test_an_epoch_holds_every_pair_once_within_the_budget_in_at_most_k_shapes_every_epoch():
    corpus = random_corpus(3000)
    sampler = bucketed_sampler(corpus, 6, max_tokens=1000)
    ladder = np.unique(sampler.sizes)
    assert len(ladder) == 6
    epochs = {}
    for epoch in (1, 2):
        batches = sampler.batches(epoch)
        pairs = np.concatenate([batch[batch >= 0] for batch in batches])
        assert sorted(pairs.tolist()) == list(range(3000))
        shapes, share = batch_shapes(batches, corpus.src_lengths, corpus.tgt_lengths, ladder=ladder)
        assert len(shapes) <= 6 and all(src_len == tgt_len for _, src_len, tgt_len in shapes)
        assert all(rows * width <= 1000 for rows, width, _ in shapes) and 0.0 < share < 0.35
        # (0.31 here: random source and target lengths are independent, real pairs' are not)
        dummy = sum(int((batch < 0).sum()) for batch in batches)
        assert dummy < len(batches)  # fewer than one row per batch: the equal cut wastes nearly nothing
        epochs[epoch] = (shapes, [batch.tolist() for batch in batches])
    assert epochs[1][0] == epochs[2][0] and epochs[1][1] != epochs[2][1]  # same shapes, reshuffled pairs
    assert sampler.batches(1)[0].tolist() == epochs[1][1][0]  # a function of (seed, epoch)


def test_replicas_split_one_list_of_bucketed_batches():
    corpus = random_corpus(500, seed=1)
    alone = bucketed_sampler(corpus, 4, max_tokens=400).batches(2)
    ranks = [bucketed_sampler(corpus, 4, max_tokens=400, num_replicas=2, rank=r).batches(2) for r in (0, 1)]
    usable = len(alone) - len(alone) % 2
    assert [b.tolist() for b in ranks[0]] == [b.tolist() for b in alone[0:usable:2]]
    assert [b.tolist() for b in ranks[1]] == [b.tolist() for b in alone[1:usable:2]]


def test_collate_pads_both_sides_to_the_bucket_and_fills_dummy_rows():
    corpus = random_corpus(20, seed=2, max_len=12)
    ladder = np.asarray([8, 16])
    plain = collate(corpus, [4, 7], PAD, BOS, EOS)
    bucketed = collate(corpus, [4, 7, -1], PAD, BOS, EOS, bucket_widths=ladder)
    width = int(bucket_of(np.asarray([max(plain.src_tokens.shape[1], plain.tgt_input.shape[1])]), ladder)[0])
    assert bucketed.src_tokens.shape == bucketed.tgt_input.shape == (3, width)
    for name in ("src_tokens", "tgt_input", "tgt_output", "src_padding_mask"):
        real, padded = getattr(plain, name), getattr(bucketed, name)[:2]
        assert torch.equal(padded[:, : real.shape[1]], real)
        assert (padded[:, real.shape[1] :] == (True if name == "src_padding_mask" else PAD)).all()
    assert bucketed.src_tokens[2].tolist() == [EOS] + [PAD] * (width - 1)
    assert bucketed.src_padding_mask[2].tolist() == [False] + [True] * (width - 1)
    assert bucketed.tgt_input[2].tolist() == [BOS] + [PAD] * (width - 1)
    assert (bucketed.tgt_output[2] == PAD).all()  # no label
    assert (bucketed.num_src_tokens, bucketed.num_tgt_tokens, len(bucketed)) == (
        plain.num_src_tokens,
        plain.num_tgt_tokens,
        2,
    )


@pytest.mark.parametrize("static_rows", [False, True])
def test_bucket_padding_and_dummy_rows_change_neither_loss_nor_gradients(static_rows):
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=16, heads=2, ffn_dim=32, encoder_layers=2, decoder_layers=2, dropout=0.0)
    model = build_model(cfg, 50, 50, PAD, joint_vocab=True).train()
    corpus = random_corpus(30, seed=4, max_len=15)
    network = TranslationLoss(model, PAD, 0.1, static_rows=static_rows)
    results = []
    for batch in (
        collate(corpus, [1, 5, 9], PAD, BOS, EOS),
        collate(corpus, [1, 5, 9, -1, -1], PAD, BOS, EOS, bucket_widths=np.asarray([12, 20, 40])),
    ):
        model.zero_grad()
        tokens = None if static_rows else batch.num_tgt_tokens
        loss, nll = network(batch.src_tokens, batch.src_padding_mask, batch.tgt_input, batch.tgt_output, tokens)
        loss.backward()
        results.append((loss.detach(), nll, [p.grad.clone() for p in model.parameters()]))
    (loss, nll, grads), (padded_loss, padded_nll, padded_grads) = results
    assert torch.allclose(loss, padded_loss, rtol=1e-5) and torch.allclose(nll, padded_nll, rtol=1e-5)
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(grads, padded_grads, strict=True))


def test_a_fixed_seed_run_trains_the_same_whichever_way_its_batches_are_padded():
    """The same batches (shape buckets' pairs, dummy rows included) padded to their buckets or
    to their own lengths: the same losses within fp32 noise, update after update."""
    bucketed, plain = synthetic_trainer(["train.shape_buckets=4"]), synthetic_trainer(["train.shape_buckets=4"])
    plain.parts.batches.bucket_widths = None  # collate pads to the batch's own lengths
    for _ in range(5):
        a, b = bucketed.run_update(), plain.run_update()
        assert float(a["loss_sum"]) == pytest.approx(float(b["loss_sum"]), rel=1e-5)
        assert a["tgt_tokens"] == b["tgt_tokens"] and a["sentences"] == b["sentences"]
    shapes = bucketed.parts.batches.shapes_seen
    assert 1 < len(shapes) <= 4 and all(src_len == tgt_len for _, src_len, tgt_len in shapes)
