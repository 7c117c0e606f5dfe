"""The terminology file: how source terms are found (mtrain.decode.requests.terminology)."""

from __future__ import annotations

import pytest

from mtrain.decode.requests.terminology import Glossary, read_glossary
from mtrain.errors import MtrainError


def test_terms_match_whole_words_case_sensitively_longest_first():
    glossary = Glossary.of({"Hund": "dog", "New York": "NY", "New York City": "NYC", "Bank": "bank", "Mann": "man"})
    assert glossary.constraints("Der Hund (Hund) bellt.") == ["dog"]  # once, however often
    assert glossary.constraints("Die Hundehütte, der Haushund") == []  # not inside words
    assert glossary.constraints("in New  York City und New York") == ["NYC", "NY"]  # longest at a place
    assert glossary.constraints("eine bank und ein mann") == []  # case counts
    folded = Glossary.of({"Hund": "dog", "Straße": "street"}, ignore_case=True)
    assert folded.constraints("HUND auf der STRASSE, der Straße") == ["dog", "street"]
    assert folded.constraints("ein hund") == ["dog"]


def test_overlapping_terms_the_leftmost_wins():
    glossary = Glossary.of({"roten Hut": "red hat", "Hut spielt": "hat plays"})
    assert glossary.constraints("mit einem roten Hut spielt") == ["red hat"]


def test_a_malformed_glossary_line_is_named(tmp_path):
    path = tmp_path / "terms.tsv"
    path.write_text("# comment\nHund\tdog\n\nKatze cat\n", encoding="utf-8")
    with pytest.raises(MtrainError, match=r"terms=.*terms.tsv line 4: expected `source term<TAB>target term`"):
        read_glossary(path)
    path.write_text("Hund\tdog\nHund\thound\n", encoding="utf-8")
    with pytest.raises(MtrainError, match="line 2: 'Hund' has the target 'hound' here and 'dog' on line 1"):
        read_glossary(path)
