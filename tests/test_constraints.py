"""Target prefixes, lexical constraints and avoided phrases in the search (mtrain.decode.search.constraints)."""

from __future__ import annotations

import pytest
import torch

from mtrain.config import DecodeConfig
from mtrain.decode.engines.ensemble import EnsembleModel
from mtrain.decode.search.constraints import ControlIds
from mtrain.decode.search.generator import generate
from mtrain.decode.search.steering import VocabRules, batch_processors
from tests.tiny_models import BOS, EOS, PAD, VOCAB, source_batch, tiny_model, train_to_copy

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny models


@pytest.fixture(scope="module")
def models():
    """Two copy-task models (a single one, and an ensemble member beside it)."""
    torch.set_num_threads(1)
    return train_to_copy(tiny_model(seed=21), steps=80), train_to_copy(tiny_model(seed=22), steps=60, seed=1)


def decode(model, src, mask, controls=None, word_continuations=(), **cfg):
    """`generate` with the batch's controls as the engine passes them: step processors."""
    config = DecodeConfig(**cfg)
    processors = batch_processors(config, VocabRules(word_continuations=tuple(word_continuations)), controls, src, EOS)
    return generate(model, src, mask, config, BOS, EOS, PAD, processors=processors)


def contains(tokens: list[int], phrase: tuple[int, ...]) -> bool:
    n = len(phrase)
    return any(tuple(tokens[i : i + n]) == phrase for i in range(len(tokens) - n + 1))


def position(tokens: list[int], phrase: tuple[int, ...]) -> int:
    n = len(phrase)
    return next(i for i in range(len(tokens) - n + 1) if tuple(tokens[i : i + n]) == phrase)


def outputs(results):
    return [[(h.tokens, h.score, h.log_prob) for h in hyps] for hyps in results]


@pytest.mark.parametrize("beam,nbest", [(1, 1), (5, 1), (5, 3)])
def test_without_controls_the_output_is_bit_identical(beam, nbest, models):
    src, mask = source_batch([6, 9, 4, 8], seed=3)
    plain = decode(models[0], src, mask, beam=beam, nbest=nbest)
    for controls in ([None] * 4, [ControlIds()] * 4):
        assert outputs(decode(models[0], src, mask, controls, beam=beam, nbest=nbest)) == outputs(plain)


def random_phrases(seed: int, count: int, length: int) -> list[tuple[int, ...]]:
    generator = torch.Generator().manual_seed(seed)
    return [tuple(torch.randint(4, VOCAB, (length,), generator=generator).tolist()) for _ in range(count)]


@pytest.mark.parametrize("beam,nbest", [(1, 1), (5, 1), (5, 5)])
@pytest.mark.parametrize("ensemble", [False, True])
def test_every_output_holds_every_constraint(beam, nbest, ensemble, models):
    model = EnsembleModel(list(models)) if ensemble else models[0]
    src, mask = source_batch([7, 9, 5, 8, 6], seed=4)
    controls = [
        ControlIds(constraints=(phrase,)) if i % 2 else ControlIds(constraints=(phrase, random_phrases(i, 1, 1)[0]))
        for i, phrase in enumerate(random_phrases(7, 5, 2))
    ]
    results = decode(model, src, mask, controls, beam=beam, nbest=nbest)
    for hyps, control in zip(results, controls, strict=True):
        assert len(hyps) == nbest
        for hyp in hyps:
            assert all(contains(hyp.tokens, phrase) for phrase in control.constraints), (hyp.tokens, control)


def test_ordered_constraints_appear_in_their_order(models):
    src, mask = source_batch([8, 9, 7], seed=5)
    pairs = [tuple(random_phrases(seed, 2, 2)) for seed in (1, 2, 3)]
    controls = [ControlIds(constraints=pair, ordered=True) for pair in pairs]
    for hyps, (first, second) in zip(decode(models[0], src, mask, controls, beam=5, nbest=3), pairs, strict=True):
        for hyp in hyps:
            assert contains(hyp.tokens, first) and contains(hyp.tokens, second)
            assert position(hyp.tokens, first) + len(first) <= max(
                i for i in range(len(hyp.tokens)) if tuple(hyp.tokens[i : i + 2]) == second
            )


@pytest.mark.parametrize("beam,nbest", [(1, 1), (5, 5)])
def test_avoided_phrases_never_appear(beam, nbest, models):
    src, mask = source_batch([7, 9, 6], seed=6)
    plain = decode(models[0], src, mask, beam=beam, nbest=nbest)
    # Ban what the model wrote: a token of the best output and a pair of every hypothesis.
    controls = []
    for hyps in plain:
        best = hyps[0].tokens
        pairs = {tuple(h.tokens[1:3]) for h in hyps if len(h.tokens) >= 3}
        controls.append(ControlIds(avoid=((best[0],), *sorted(pairs))))
    for hyps, control in zip(decode(models[0], src, mask, controls, beam=beam, nbest=nbest), controls, strict=True):
        for hyp in hyps:
            assert hyp.tokens and not any(contains(hyp.tokens, phrase) for phrase in control.avoid)


@pytest.mark.parametrize("beam", [1, 5])
def test_the_output_starts_with_the_prefix(beam, models):
    src, mask = source_batch([7, 9, 6, 5], seed=8)
    prefixes = [tuple(p) for p in random_phrases(9, 4, 3)]
    controls = [ControlIds(prefix=p[: 1 + i % 3]) for i, p in enumerate(prefixes)]
    for hyps, control in zip(decode(models[0], src, mask, controls, beam=beam, nbest=beam), controls, strict=True):
        for hyp in hyps:
            assert tuple(hyp.tokens[: len(control.prefix)]) == control.prefix


def test_a_prefix_the_model_would_write_changes_nothing_and_is_scored(models):
    """Greedy: forcing the tokens greedy search chose gives the same output and score (the
    prefix's log-probabilities are in the score, as fairseq's --prefix-size)."""
    src, mask = source_batch([7, 9, 6], seed=10)
    plain = decode(models[0], src, mask, beam=1)
    controls = [ControlIds(prefix=tuple(hyps[0].tokens[:3])) for hyps in plain]
    assert outputs(decode(models[0], src, mask, controls, beam=1)) == outputs(plain)


def test_prefix_constraints_and_avoid_together_with_sentences_without(models):
    src, mask = source_batch([7, 9, 6, 8], seed=11)
    prefix, must, never = (5, 6), (30, 31), (7,)
    controls = [ControlIds(prefix=prefix, constraints=(must,), avoid=(never,)), None, ControlIds(), None]
    results = decode(models[0], src, mask, controls, beam=5, nbest=2)
    plain = decode(models[0], src, mask, beam=5, nbest=2)
    for hyp in results[0]:
        assert tuple(hyp.tokens[:2]) == prefix and contains(hyp.tokens, must) and 7 not in hyp.tokens
    assert outputs(results[1:]) == outputs(plain[1:])  # the others decode as without controls


@pytest.mark.parametrize("beam", [1, 5])
def test_controls_add_no_host_synchronisation(beam, models, monkeypatch):
    """Constraints, avoided phrases and prefixes are tensor work: the loop still reads the
    host twice per step (tests/test_generator.py's count)."""
    from tests.tiny_models import record_host_syncs

    model = models[0]
    src, mask = source_batch([9, 5, 7, 3, 6], seed=2)
    controls = [
        ControlIds(prefix=(5,), constraints=((30, 31), (9,)), avoid=((7, 8),), ordered=i % 2 == 1) for i in range(5)
    ]
    events = record_host_syncs(monkeypatch, model)
    decode(model, src, mask, controls, beam=beam)
    first, last = events.index("step"), len(events) - events[::-1].index("step")
    loop = events[first:last]
    steps = loop.count("step")
    assert steps > 3
    assert len(loop) - steps <= 2 * steps, [e for e in loop if e != "step"]


def test_a_constraint_is_never_continued_by_a_word_continuation(models):
    """With `word_continuations` (pieces that continue a word), none directly follows a met
    constraint: the constraint ends a word."""
    src, mask = source_batch([7, 9, 6, 8], seed=12)
    phrases = random_phrases(13, 4, 1)
    continuations = list(range(4, VOCAB, 2))  # half the pieces "continue a word"
    controls = [ControlIds(constraints=(p,)) for p in phrases]
    results = decode(models[0], src, mask, controls, word_continuations=continuations, beam=5, nbest=5)
    for hyps, phrase in zip(results, phrases, strict=True):
        for hyp in hyps:
            ends = [i + len(phrase) for i in range(len(hyp.tokens)) if tuple(hyp.tokens[i : i + len(phrase)]) == phrase]
            assert ends and all(end == len(hyp.tokens) or hyp.tokens[end] not in continuations for end in ends)


def test_a_constraint_may_continue_into_another_that_extends_it(models):
    """`bull` and `bullpen` (`bull` + `pen`, `pen` a word continuation): both are met."""
    src, mask = source_batch([7, 9], seed=14)
    short, long = (20,), (20, 21)
    controls = [ControlIds(constraints=(short, long))] * 2
    results = decode(models[0], src, mask, controls, word_continuations=[21], beam=5, nbest=3)
    for hyps in results:
        for hyp in hyps:
            assert contains(hyp.tokens, long)
