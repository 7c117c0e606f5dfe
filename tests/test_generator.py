"""The generator loop: KV cache vs recomputation, greedy vs beam 1, padding, lengths, attention."""

from __future__ import annotations

import pytest
import torch

import mtrain.decode.search.generator as generator_module
from mtrain.config import DecodeConfig
from mtrain.decode.search.algorithms import BeamSearch
from mtrain.decode.search.generator import generate
from tests.tiny_models import BOS, EOS, PAD, VOCAB, record_host_syncs, source_batch, tiny_model, train_to_copy

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny models


@pytest.fixture(scope="module")
def copy_model():
    torch.set_num_threads(1)
    return train_to_copy(tiny_model(seed=11))


def decode(model, src, mask, use_cache=True, **cfg):
    return generate(model, src, mask, DecodeConfig(**cfg), BOS, EOS, PAD, use_cache=use_cache)


@pytest.mark.parametrize("beam,nbest", [(1, 1), (4, 4)])
@pytest.mark.parametrize("model_kind", ["trained", "random-rope"])
def test_cache_gives_the_same_tokens_and_scores_as_recomputation(beam, nbest, model_kind, copy_model):
    model = copy_model if model_kind == "trained" else tiny_model(positions="rope")
    src, mask = source_batch([5, 9, 3, 12, 7, 2])
    cfg = DecodeConfig(beam=beam, nbest=nbest, max_len_a=1.0, max_len_b=4, no_repeat_ngram=3)
    cached = generate(model, src, mask, cfg, BOS, EOS, PAD, use_cache=True)
    recomputed = generate(model, src, mask, cfg, BOS, EOS, PAD, use_cache=False)
    for a, b in zip(cached, recomputed, strict=True):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        for x, y in zip(a, b, strict=True):
            assert abs(x.score - y.score) <= 1e-5 and abs(x.log_prob - y.log_prob) <= 1e-5
    if model_kind == "trained":  # hypotheses ended at different steps, before max length
        lengths = {len(h.tokens) for sentence in cached for h in sentence}
        assert len(lengths) >= 3
        assert any(
            len(h.tokens) < int((~m).sum()) + 4 for sentence, m in zip(cached, mask, strict=True) for h in sentence
        )


def greedy_by_hand(model, src, mask):
    """Greedy decoding written out plainly: the full forward pass and argmax, per sentence."""
    outputs = []
    for row in range(src.size(0)):
        length = int((~mask[row]).sum())
        source = src[row : row + 1, :length]
        limit = int(1.0 * length + 4)
        prefix = [BOS]
        log_prob = 0.0
        while True:
            with torch.no_grad():
                lprobs = torch.log_softmax(model(source, source.eq(PAD), torch.tensor([prefix])).float()[0, -1], -1)
            lprobs[[PAD, BOS]] = float("-inf")
            if len(prefix) - 1 < 1:
                lprobs[EOS] = float("-inf")
            token = EOS if len(prefix) - 1 == limit else int(lprobs.argmax())
            log_prob += float(lprobs[token])
            if token == EOS:
                break
            prefix.append(token)
        outputs.append((prefix[1:], log_prob / len(prefix)))
    return outputs


def test_greedy_and_beam_one_equal_greedy_by_hand(monkeypatch, copy_model):
    model = copy_model
    src, mask = source_batch([6, 4, 10, 8], seed=1)
    expected = greedy_by_hand(model, src, mask)
    greedy = decode(model, src, mask, beam=1, max_len_a=1.0, max_len_b=4)
    monkeypatch.setattr(generator_module, "build_search", lambda cfg, device: BeamSearch(1))
    beam_one = decode(model, src, mask, beam=1, max_len_a=1.0, max_len_b=4)
    for (tokens, score), g, b in zip(expected, greedy, beam_one, strict=True):
        assert g[0].tokens == tokens == b[0].tokens
        assert g[0].score == pytest.approx(score, abs=1e-5) and b[0].score == pytest.approx(score, abs=1e-5)


@pytest.mark.parametrize("beam", [1, 5])
def test_sentence_alone_and_in_a_padded_batch_give_the_same_output(beam, copy_model):
    model = copy_model
    src, mask = source_batch([4, 11, 6, 9], seed=2)
    together = decode(model, src, mask, beam=beam, nbest=beam)
    for row in range(src.size(0)):
        length = int((~mask[row]).sum())
        alone = decode(model, src[row : row + 1, :length], mask[row : row + 1, :length], beam=beam, nbest=beam)[0]
        assert [h.tokens for h in alone] == [h.tokens for h in together[row]]
        assert [h.score for h in alone] == pytest.approx([h.score for h in together[row]], abs=1e-5)


def test_lengths_nbest_order_and_scores(copy_model):
    model = copy_model
    src, mask = source_batch([3, 7, 5])
    hyps = decode(model, src, mask, beam=6, nbest=4, max_len_a=0.5, max_len_b=2, min_len=2, length_penalty=1.0)
    for sentence, length in zip(hyps, [3, 7, 5], strict=True):
        assert len(sentence) == 4
        assert [h.score for h in sentence] == sorted((h.score for h in sentence), reverse=True)
        assert len({tuple(h.tokens) for h in sentence}) == 4
        for h in sentence:
            assert 2 <= len(h.tokens) <= int(0.5 * length + 2)
            assert h.score == pytest.approx(h.log_prob / (len(h.tokens) + 1), abs=1e-6)
            assert not {PAD, BOS, EOS} & set(h.tokens)


def test_finished_sentences_leave_the_batch():
    model = tiny_model(seed=6)
    src, mask = source_batch([3, 3, 3, 3, 20], seed=3)
    rows_per_step = []
    original = model.decode_step

    def counting(prev_tokens, state, **kwargs):
        rows_per_step.append(prev_tokens.size(0))
        return original(prev_tokens, state, **kwargs)

    model.decode_step = counting
    decode(model, src, mask, beam=3, max_len_a=1.0, max_len_b=0)
    assert rows_per_step[0] == 5  # the first step: one [bos] per sentence, shared by its beam
    assert rows_per_step[1] == 5 * 3
    assert rows_per_step[-1] == 3  # only the long sentence's beam is left
    assert rows_per_step[1:] == sorted(rows_per_step[1:], reverse=True)


@pytest.mark.parametrize("layer,shape", [("last", ()), ("all", (2,)), (0, ())])
def test_attention_rows_per_output_token(layer, shape):
    model = tiny_model(seed=7)
    src, mask = source_batch([5, 8], seed=4)
    hyps = generate(model, src, mask, DecodeConfig(beam=3, nbest=2), BOS, EOS, PAD, attention_layer=layer)
    for sentence, length in zip(hyps, [5, 8], strict=True):
        for h in sentence:
            assert h.attention.shape == (len(h.tokens) + 1, *shape, length)
            torch.testing.assert_close(h.attention.sum(-1), torch.ones(h.attention.shape[:-1]), atol=1e-4, rtol=0)


def test_attention_is_that_of_the_returned_hypothesis(copy_model):
    """A beam hypothesis' attention rows follow its own history through reorderings."""
    model = copy_model
    src, mask = source_batch([6], seed=5)
    best = generate(model, src, mask, DecodeConfig(beam=4, nbest=3), BOS, EOS, PAD, attention_layer="last")[0]
    for h in best:
        state = model.start_decoding(model.encode(src, mask), mask)
        rows = []
        with torch.no_grad():
            for token in [BOS] + h.tokens:
                _, attention = model.decode_step(torch.tensor([token]), state, need_attention=True)
                rows.append(attention[0])
        torch.testing.assert_close(h.attention, torch.stack(rows), atol=1e-5, rtol=0)


@pytest.mark.parametrize("beam", [1, 4])
def test_a_restricted_output_vocabulary_is_all_the_decoder_emits(beam):
    """model.output_vocab=target: searches see -inf outside the restriction, with and without
    the KV cache, in fp32 and under bf16 autocast."""
    model = tiny_model(seed=10, output_vocab="target")
    allowed = [EOS, *range(10, VOCAB, 3)]
    model.restrict_output(allowed)
    src, mask = source_batch([5, 7, 9], seed=6)
    outputs = [
        decode(model, src, mask, beam=beam, nbest=beam),
        decode(model, src, mask, beam=beam, nbest=beam, use_cache=False),
    ]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        outputs.append(decode(model, src, mask, beam=beam, nbest=beam))
    emitted = {token for hyps in outputs for sentence in hyps for h in sentence for token in h.tokens}
    assert emitted and emitted <= set(allowed)
    assert [[h.tokens for h in s] for s in outputs[0]] == [[h.tokens for h in s] for s in outputs[1]]


def test_bf16_autocast_decodes():
    model = tiny_model(seed=9)
    src, mask = source_batch([5, 7])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hyps = decode(model, src, mask, beam=3)
    assert all(len(s) == 1 and s[0].score <= 0 for s in hyps)


@pytest.mark.parametrize("beam", [1, 4])
def test_the_search_loop_synchronises_with_the_host_twice_per_step(beam, copy_model, monkeypatch):
    """On a GPU each host synchronisation stalls the queue of kernels; per step the loop needs
    two (which hypotheses finished, which sentences stay) and nothing else reads a tensor."""
    events = record_host_syncs(monkeypatch, copy_model)
    src, mask = source_batch([9, 5, 7, 3, 6], seed=2)
    decode(copy_model, src, mask, beam=beam, nbest=1)
    first, last = events.index("step"), len(events) - events[::-1].index("step")
    loop = events[first:last]
    steps = loop.count("step")
    assert steps > 3
    assert len(loop) - steps <= 2 * steps, [e for e in loop if e != "step"]


def test_stop_is_asked_before_every_step_and_ends_the_decode_where_it_says_so():
    """Issue 58: a server request past its deadline went on decoding for minutes after its 504."""
    from mtrain.decode.search.generator import DecodeStopped

    model = tiny_model()  # random: every hypothesis runs to its max length (41 tokens, and EOS)
    src, mask = source_batch([9, 5])
    cfg = dict(beam=3, max_len_a=4.0, max_len_b=5)
    asked: list[int] = []

    def never() -> bool:
        asked.append(1)
        return False

    full = generate(model, src, mask, DecodeConfig(**cfg), BOS, EOS, PAD, stop=never)
    steps = len(asked)
    assert steps == max(len(hyps[0].tokens) for hyps in full) + 1  # once per step, the EOS step too
    assert full == decode(model, src, mask, **cfg)  # asking changes nothing

    asked.clear()
    with pytest.raises(DecodeStopped, match=f"stopped at step 3 of at most {steps}"):
        generate(model, src, mask, DecodeConfig(**cfg), BOS, EOS, PAD, stop=lambda: never() or len(asked) > 3)
    assert len(asked) == 4  # no step after the one it stopped at
