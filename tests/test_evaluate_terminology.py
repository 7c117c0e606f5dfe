"""mtrain.evaluate.terminology: the WMT21 terminology metrics, each on a case worked by hand."""

from __future__ import annotations

import pytest

from mtrain.decode.requests.terminology import Glossary, read_glossary
from mtrain.evaluate.terminology import score_terms, weighted_edit_rate, words

CANINE = Glossary.of({"Hund": "canine"}, replaced={"Hund": ["dog"]})


def scores(hypothesis: str, reference: str, source: str = "Der Hund bellt .", glossary: Glossary = CANINE):
    return score_terms(glossary, [source], [hypothesis], [reference])


def test_exact_match_counts_a_term_in_the_output_as_whole_words():
    assert scores("The canine barks.", "The canine barks.").exact_match == 1.0
    assert scores("The canines bark.", "The canine barks.").exact_match == 0.0  # not the word itself
    assert scores("A dog barks.", "The canine barks.").exact_match == 0.0


def test_a_term_is_counted_once_per_sentence_and_each_output_occurrence_serves_one_instance():
    glossary = Glossary.of({"Hund": "dog", "Katze": "cat"})
    result = score_terms(glossary, ["Hund und Katze und Hund"], ["a dog and a dog"], ["a dog and a cat"])
    assert result.instances == 2 and result.exact_match == 0.5


def test_window_overlap_is_the_share_of_the_references_neighbours_around_the_term():
    # reference window (2 each side, punctuation skipped): a b | c d; output's: a x | c y -> 2 of 4
    result = scores("a x canine c y", "a b , canine c . d")
    assert result.window_overlap == {2: 0.5, 3: 0.5}
    assert scores("a b canine c d", "a b canine c d").window_overlap[2] == 1.0
    assert scores("a b dog c d", "a b canine c d").window_overlap[2] == 0.0  # no term in the output


def test_one_minus_term_charges_two_for_a_term_word_of_the_reference():
    assert weighted_edit_rate(words("the runs"), words("the canine runs"), [1, 2, 1]) == pytest.approx(2 / 3)
    assert weighted_edit_rate(words("the dog runs"), words("the canine runs"), [1, 2, 1]) == pytest.approx(2 / 3)
    assert weighted_edit_rate(words("the big canine runs"), words("the canine runs"), [1, 2, 1]) == pytest.approx(1 / 3)
    assert scores("The dog barks .", "The canine barks .").one_minus_term == pytest.approx(1 - 2 / 4)
    assert scores("The canine barks .", "The canine barks .").one_minus_term == 1.0


def test_the_usual_translation_kept_beside_the_term_is_counted_outside_the_term():
    assert scores("The dog canine barks.", "The canine barks.").kept_beside == 1.0
    assert scores("The canine barks.", "The canine barks.").kept_beside == 0.0
    assert scores("The dog barks.", "The canine barks.").kept_beside is None  # term not produced
    without_usual = Glossary.of({"Hund": "canine"})
    assert scores("The dog canine barks.", "x", glossary=without_usual).kept_beside is None


def test_a_glossary_file_may_name_the_words_a_term_replaces(tmp_path):
    path = tmp_path / "terms.tsv"
    path.write_text("Hund\tcanine\tdog|dogs\nMann\tgentleman\n", encoding="utf-8")
    glossary = read_glossary(path)
    assert glossary.constraints("Der Hund und der Mann") == ["canine", "gentleman"]
    assert glossary.replaced == {"Hund": ["dog", "dogs"]}
    assert read_glossary(path, ignore_case=True).replaced == {"hund": ["dog", "dogs"]}


def test_the_synonym_glossary_script_writes_the_glossary_and_references_holding_its_terms(tmp_path):
    from pathlib import Path

    from tests.warm_process import run_python

    (tmp_path / "src.de").write_text("Ein Mann und ein Hund .\nZwei Katzen .\nEin Hund .\n", encoding="utf-8")
    (tmp_path / "ref.en").write_text("A man and a dog .\nTwo cats .\nA puppy .\n", encoding="utf-8")
    script = Path(__file__).resolve().parents[1] / "scripts" / "synonym_terms.py"
    result = run_python(
        str(script), "--src", str(tmp_path / "src.de"), "--ref", str(tmp_path / "ref.en"),
        "--out", str(tmp_path / "terms.tsv"), "--ref-out", str(tmp_path / "ref.terms.en"), text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "3 source matches in 3 sentences; 2 references now hold the term, 1 had none" in result.stdout
    lines = (tmp_path / "ref.terms.en").read_text(encoding="utf-8").splitlines()
    assert lines == ["A gentleman and a canine .", "Two cats .", "A puppy ."]
    glossary = read_glossary(tmp_path / "terms.tsv")
    assert glossary.targets["Hund"] == "canine" and glossary.replaced["Mann"] == ["man", "guy"]
    assert score_terms(glossary, ["Ein Hund ."], ["A canine ."], ["A canine ."]).exact_match == 1.0
