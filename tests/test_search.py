"""Search algorithms, step processors and sampling, checked against exhaustive search."""

from __future__ import annotations

import itertools

import pytest
import torch

from mtrain.config import DecodeConfig
from mtrain.decode.search.algorithms import BeamSearch, GreedySearch
from mtrain.decode.search.generator import generate
from mtrain.decode.search.processors import NoRepeatNgram, apply_length_limits, ban_tokens
from mtrain.decode.search.sampling import SamplingSearch, truncate_distribution
from tests.tiny_models import exhaustive_best
from tests.tiny_models import search_model as tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny models

UNK, PAD, BOS, EOS = 0, 1, 2, 3
NEG_INF = float("-inf")


# ------------------------------------------------------------------ algorithms, one step
def test_beam_step_picks_best_extensions_over_all_rows():
    lprobs = torch.log_softmax(torch.randn(2, 3, 5), dim=-1)
    scores = torch.tensor([[0.0, -1.0, -2.0], [-0.5, NEG_INF, -0.1]])
    choices = BeamSearch(3).step(lprobs, scores)
    total = (scores.unsqueeze(-1) + lprobs).view(2, -1)
    expected, flat = total.sort(dim=-1, descending=True)
    assert choices.tokens.shape == (2, 6)
    torch.testing.assert_close(choices.scores, expected[:, :6])
    torch.testing.assert_close(choices.beam_index * 5 + choices.tokens, flat[:, :6])
    assert not (choices.beam_index[1][torch.isfinite(choices.scores[1])] == 1).any()  # dead row never chosen


def test_beam_of_width_one_chooses_like_greedy():
    lprobs = torch.log_softmax(torch.randn(4, 1, 9), dim=-1)
    scores = torch.randn(4, 1)
    beam, greedy = BeamSearch(1).step(lprobs, scores), GreedySearch(1).step(lprobs, scores)
    assert torch.equal(beam.tokens[:, :1], greedy.tokens)
    torch.testing.assert_close(beam.scores[:, :1], greedy.scores)


def test_beam_starts_with_one_live_row_sampling_with_all():
    assert torch.isinf(BeamSearch(4).initial_scores(2, torch.device("cpu"))[:, 1:]).all()
    assert (SamplingSearch(4).initial_scores(2, torch.device("cpu")) == 0).all()


# ------------------------------------------------------------------ step processors
def test_length_limits_ban_then_force_eos():
    lprobs = torch.log_softmax(torch.randn(3, 6), dim=-1)
    original = lprobs.clone()
    apply_length_limits(lprobs, step=0, min_len=1, max_len=torch.tensor([5, 5, 0]), eos_id=EOS)
    # Row 2 is at its limit: only EOS, with its own log-prob (the limit wins over min_len).
    assert torch.isinf(lprobs[2, [0, 1, 2, 4, 5]]).all() and lprobs[2, EOS] == original[2, EOS]
    assert torch.isinf(lprobs[:2, EOS]).all()
    assert torch.equal(lprobs[:2, [0, 1, 2, 4, 5]], original[:2, [0, 1, 2, 4, 5]])


def test_ban_tokens():
    lprobs = torch.zeros(2, 5)
    ban_tokens(lprobs, (PAD, BOS))
    assert torch.isinf(lprobs[:, [PAD, BOS]]).all() and (lprobs[:, [0, 3, 4]] == 0).all()


def test_no_repeat_ngram_bans_exactly_the_repeating_tokens():
    lprobs = torch.zeros(3, 10)
    outputs = torch.tensor([[5, 6, 7, 5], [5, 6, 5, 6], [4, 4, 4, 4]])
    NoRepeatNgram(2)(lprobs, outputs)
    banned = [set(torch.nonzero(torch.isinf(row)).flatten().tolist()) for row in lprobs]
    assert banned == [{6}, {5}, {4}]  # "5 6" seen -> 6 after 5; "6 5" seen -> 5 after 6; "4 4"
    lprobs = torch.zeros(1, 10)
    NoRepeatNgram(3)(lprobs, torch.tensor([[5, 6, 7, 5, 6]]))
    assert torch.isinf(lprobs[0]).nonzero().flatten().tolist() == [7]
    lprobs = torch.zeros(1, 10)
    NoRepeatNgram(3)(lprobs, torch.tensor([[5, 6]]))  # too short for any 3-gram
    assert not torch.isinf(lprobs).any()


def test_no_repeat_ngram_in_decoding_blocks_repeats():
    model = tiny_model(12)
    src = torch.randint(4, 12, (6, 7))
    src[:, -1] = EOS
    mask = torch.zeros_like(src, dtype=torch.bool)

    def repeats(hyps, n):
        count = 0
        for sentence in hyps:
            for hyp in sentence:
                grams = [tuple(hyp.tokens[i : i + n]) for i in range(len(hyp.tokens) - n + 1)]
                count += len(grams) - len(set(grams))
        return count

    base = DecodeConfig(beam=3, nbest=3, max_len_a=0.0, max_len_b=20)
    assert repeats(generate(model, src, mask, base, BOS, EOS, PAD), 2) > 0  # random models repeat
    for n in (1, 2, 3):
        cfg = DecodeConfig(beam=3, nbest=3, max_len_a=0.0, max_len_b=20, no_repeat_ngram=n)
        assert repeats(generate(model, src, mask, cfg, BOS, EOS, PAD), n) == 0


# ------------------------------------------------------------------ sampling
def test_truncate_distribution_top_k_and_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isfinite(truncate_distribution(logits, top_k=2)).tolist() == [[True, True, False, False]]
    assert torch.isfinite(truncate_distribution(logits, top_p=0.7)).tolist() == [[True, True, False, False]]
    assert torch.isfinite(truncate_distribution(logits, top_p=0.8)).tolist() == [[True, True, False, False]]
    assert torch.isfinite(truncate_distribution(logits, top_p=0.81)).tolist() == [[True, True, True, False]]
    assert torch.isfinite(truncate_distribution(logits, top_p=1e-6)).tolist() == [[True, False, False, False]]


def test_sampling_is_seeded_and_top_k_one_is_greedy():
    model = tiny_model(12, sharpness=1.0)
    src = torch.randint(4, 12, (4, 6))
    src[:, -1] = EOS
    mask = torch.zeros_like(src, dtype=torch.bool)

    def run(**overrides):
        cfg = DecodeConfig(**{"beam": 1, "max_len_a": 0.0, "max_len_b": 12, **overrides})
        return [[(h.tokens, h.score) for h in sentence] for sentence in generate(model, src, mask, cfg, BOS, EOS, PAD)]

    first = run(sampling="topk", top_k=0, nbest=4, seed=7)
    assert first == run(sampling="topk", top_k=0, nbest=4, seed=7)
    assert first != run(sampling="topk", top_k=0, nbest=4, seed=8)
    assert all(len(sentence) == 4 for sentence in first)  # nbest independent samples
    assert all(a[1] >= b[1] for sentence in first for a, b in itertools.pairwise(sentence))
    greedy = run()
    assert run(sampling="topk", top_k=1, seed=3) == greedy
    assert run(sampling="topp", top_p=1e-6, seed=3) == greedy
    hot = run(sampling="topk", top_k=0, temperature=5.0, nbest=4, seed=7)
    assert hot != first


# ------------------------------------------------------------------ beam search vs exhaustive search
@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
@pytest.mark.parametrize("early_stopping", [True, False])
def test_full_width_beam_equals_exhaustive_search(alpha, early_stopping):
    vocab, max_len = 9, 3  # 6 real output tokens (5 + EOS): 155 possible outputs
    model = tiny_model(vocab, seed=1)
    for seed in range(3):
        torch.manual_seed(100 + seed)
        src = torch.cat([torch.randint(4, vocab, (1, 4)), torch.tensor([[EOS]])], dim=1)
        best_tokens, best_score, all_scores = exhaustive_best(model, src, max_len, alpha, vocab)
        cfg = DecodeConfig(
            beam=len(all_scores),
            nbest=1,
            max_len_a=0.0,
            max_len_b=max_len,
            min_len=1,
            length_penalty=alpha,
            early_stopping=early_stopping,
        )
        hyp = generate(model, src, src.eq(PAD), cfg, BOS, EOS, PAD)[0][0]
        assert hyp.tokens == best_tokens
        assert hyp.score == pytest.approx(best_score, abs=1e-5)
        for beam in (1, 2, 3, 5, 10):
            narrow = DecodeConfig(
                beam=beam,
                nbest=1,
                max_len_a=0.0,
                max_len_b=max_len,
                length_penalty=alpha,
                early_stopping=early_stopping,
            )
            found = generate(model, src, src.eq(PAD), narrow, BOS, EOS, PAD)[0][0]
            assert found.score <= best_score + 1e-5
            # Its score is the true score of the sequence it returns.
            index = next(
                i
                for i, y in enumerate(
                    itertools.chain.from_iterable(
                        itertools.product([t for t in range(vocab) if t not in (PAD, BOS, EOS)], repeat=n)
                        for n in range(1, max_len + 1)
                    )
                )
                if list(y) == found.tokens
            )
            assert found.score == pytest.approx(float(all_scores[index]), rel=1e-6, abs=1e-5)


def test_exact_stopping_is_never_worse_than_early_stopping_here():
    vocab = 9
    model = tiny_model(vocab, seed=2)
    torch.manual_seed(5)
    src = torch.cat([torch.randint(4, vocab, (8, 5)), torch.full((8, 1), EOS)], dim=1)
    early = DecodeConfig(beam=2, max_len_a=0.0, max_len_b=6, length_penalty=1.0, early_stopping=True)
    exact = DecodeConfig(beam=2, max_len_a=0.0, max_len_b=6, length_penalty=1.0, early_stopping=False)
    early_hyps = generate(model, src, src.eq(PAD), early, BOS, EOS, PAD)
    exact_hyps = generate(model, src, src.eq(PAD), exact, BOS, EOS, PAD)
    for a, b in zip(early_hyps, exact_hyps, strict=True):
        assert b[0].score >= a[0].score - 1e-6


def test_length_limits_without_rows_at_the_limit_only_ban_early_eos():
    lprobs = torch.log_softmax(torch.randn(2, 6), dim=-1)
    original = lprobs.clone()
    apply_length_limits(lprobs, step=1, min_len=3, max_len=None, eos_id=EOS)
    assert torch.isinf(lprobs[:, EOS]).all()
    apply_length_limits(original, step=3, min_len=3, max_len=torch.tensor([5, 9]), eos_id=EOS)
    assert torch.isfinite(original).all()  # past min_len, below both limits: nothing changes
