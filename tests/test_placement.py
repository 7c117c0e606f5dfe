"""mtrain.decode.search.placement: a term starts where its source word is translated, the usual word
stays out, and nothing is appended after the final full stop; each rule on a worked step."""

from __future__ import annotations

import pytest
import torch

from mtrain.decode.search.constraints import ControlIds, controls_for
from mtrain.decode.search.placement import PlacementVocab, placement_for, sentence_end_count
from mtrain.decode.search.processors import StepView

PIECES = ["<pad>", "<s>", "</s>", "▁the", "▁dog", "▁canine", ".", "▁barks", "s", "▁a"]
EOS, THE, DOG, CANINE, STOP, BARKS = 2, 3, 4, 5, 6, 7
VOCAB = PlacementVocab.of(PIECES)


def placed(sentence_ends: int = 1):
    """One sentence, beam 1, `canine` a term whose source word is source piece 1 (of 4)."""
    control = ControlIds(constraints=((CANINE,),), term_sources=((1,),), sentence_ends=sentence_ends)
    target = controls_for([control], torch.device("cpu"), EOS)
    placement = placement_for(target, [control], 4, VOCAB, -1)
    target.start(1)
    placement.start(1)
    return target, placement


def step(target, placement, best: int, peak: int | None, number: int = 0) -> torch.Tensor:
    """The processed log-probabilities of a step whose model prefers `best` (the others far
    below) and whose attention peaks on source piece `peak` (None: no attention)."""
    lprobs = torch.full((1, len(PIECES)), -8.0)
    lprobs[0, best] = -0.1
    attention = None if peak is None else torch.nn.functional.one_hot(torch.tensor([peak]), 4).float()
    view = StepView(number, torch.zeros(1, number, dtype=torch.long), torch.tensor([20]), False, attention)
    for processor in (target, placement):
        processor.observe(lprobs, view)
    for processor in (target, placement):
        processor.process(lprobs, view)
    return lprobs[0]


def choose(target, placement, token: int) -> None:
    for processor in (target, placement):
        processor.follow(torch.tensor([0]), torch.tensor([token]))


def test_the_vocabulary_sets_and_the_sources_sentence_ends():
    assert VOCAB.sentence_ends == (STOP,) and set(VOCAB.content_starts) == {THE, DOG, CANINE, BARKS, 9}
    assert sentence_end_count("Ein Hund bellt.") == 1
    assert sentence_end_count("Ein Hund. Er bellt! Wirklich?") == 3
    assert sentence_end_count("3.5 Hunde") == 0


def test_a_term_starts_where_its_source_word_is_translated_and_the_usual_word_stays_out():
    target, placement = placed()
    away = step(target, placement, best=THE, peak=0)
    assert away[CANINE] == -8.0  # attention elsewhere: the term keeps its own score
    choose(target, placement, THE)
    here = step(target, placement, best=DOG, peak=1, number=1)
    assert here[CANINE] == pytest.approx(-0.1) and here[DOG] == pytest.approx(-0.1)  # in the model's word's place
    choose(target, placement, CANINE)
    after = step(target, placement, best=DOG, peak=2, number=2)
    assert after[DOG] == float("-inf")  # `dog` was displaced by `canine`: never beside it
    assert after[BARKS] == -8.0


def test_a_hypothesis_that_wrote_its_own_word_where_offered_the_term_is_not_offered_it_again():
    target, placement = placed()
    assert step(target, placement, best=DOG, peak=1)[CANINE] == pytest.approx(-0.1)
    choose(target, placement, DOG)  # this row declined: `dog canine` would come as cheaply as `canine`
    assert step(target, placement, best=BARKS, peak=1, number=1)[CANINE] == -8.0


def test_no_full_stop_while_a_term_is_missing_when_the_source_has_one():
    target, placement = placed(sentence_ends=1)
    assert step(target, placement, best=STOP, peak=3)[STOP] == float("-inf")  # (and EOS: the constraint)
    choose(target, placement, CANINE)
    assert step(target, placement, best=STOP, peak=3, number=1)[STOP] == pytest.approx(-0.1)
    two = placed(sentence_ends=2)
    assert step(*two, best=STOP, peak=3)[STOP] == pytest.approx(-0.1)  # the first of two sentences may end
    choose(*two, STOP)
    assert step(*two, best=STOP, peak=3, number=1)[STOP] == float("-inf")


def test_constraints_that_are_no_terms_get_no_placement():
    control = ControlIds(constraints=((CANINE,),))
    target = controls_for([control], torch.device("cpu"), EOS)
    assert placement_for(target, [control], 4, VOCAB, -1) is None


def test_a_forced_prefix_is_left_alone():
    control = ControlIds(prefix=(THE,), constraints=((CANINE,),), term_sources=((1,),), sentence_ends=1)
    target = controls_for([control], torch.device("cpu"), EOS)
    placement = placement_for(target, [control], 4, VOCAB, -1)
    target.start(1)
    placement.start(1)
    forced = step(target, placement, best=DOG, peak=1)
    assert forced[THE] == -8.0 and forced[CANINE] == float("-inf")  # the prefix's token, nothing raised


def test_a_term_another_rule_banned_is_not_raised():
    _, placement = placed()
    lprobs = torch.full((1, len(PIECES)), -8.0)
    lprobs[0, DOG] = -0.1
    lprobs[0, CANINE] = float("-inf")  # e.g. the length limit: only EOS is left
    attention = torch.nn.functional.one_hot(torch.tensor([1]), 4).float()
    view = StepView(0, torch.zeros(1, 0, dtype=torch.long), torch.tensor([20]), False, attention)
    placement.observe(lprobs, view)
    placement.process(lprobs, view)
    assert lprobs[0, CANINE] == float("-inf")
