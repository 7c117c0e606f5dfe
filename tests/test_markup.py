"""Inline markup: tags out and back in by word alignments (mtrain.decode.markup), as a property
over random tag structures and random alignments, and the cases a user meets."""

from __future__ import annotations

import random
from collections import Counter
from xml.parsers import expat

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtrain.decode.markup import MarkupError, parse_markup, restore_markup, strip_markup, tags_of

WORDS = st.text(alphabet="abcdefghijklmnopqrstuvwxyzäöüß.,!?&<>\"'", min_size=1, max_size=8)
NAMES = st.sampled_from(["b", "i", "g", "x", "a", "span"])
# Attribute values with what breaks a naive parser: `>` inside quotes, entities, quotes.
VALUES = st.sampled_from(["1", "x>y", "a&amp;b", "it's", "&quot;q&quot;", "", "a b"])


def escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


@st.composite
def tag(draw, name: str) -> str:
    attributes = draw(
        st.lists(st.tuples(st.sampled_from(["id", "href", "title"]), VALUES), max_size=2, unique_by=lambda a: a[0])
    )
    return f"<{name}" + "".join(f' {key}="{value}"' for key, value in attributes)


@st.composite
def content(draw, depth: int = 0) -> str:
    """Random text with nested elements and self-closing tags, well-formed XML."""
    parts = []
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["word", "word", "element", "point"] if depth < 3 else ["word", "point"]))
        space = draw(st.sampled_from([" ", " ", ""]))
        if kind == "word":
            parts.append(escape(draw(WORDS)) + space)
        elif kind == "point":
            parts.append(draw(tag(draw(NAMES))) + "/>" + space)
        else:
            name = draw(NAMES)
            parts.append(f"{draw(tag(name))}>{draw(content(depth + 1))}</{name}>{space}")
    return "".join(parts)


def well_formed_xml(line: str) -> bool:
    try:
        expat.ParserCreate().Parse(f"<r>{line}</r>", True)
    except expat.ExpatError:
        return False
    return True


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(line=content(), seed=st.integers(0, 2**16), target_words=st.integers(0, 12))
def test_random_markup_comes_back_well_formed_with_the_same_tags(line, seed, target_words):
    markup = parse_markup(line, "xml")
    rng = random.Random(seed)
    translation = " ".join(rng.choice(["w", "x&y", "z<"]) + str(j) for j in range(target_words))
    num_src = len(markup.text.split())
    links = [(i, j) for i in range(num_src) for j in range(target_words) if rng.random() < 0.3]
    output = restore_markup(markup, translation, links)
    assert well_formed_xml(output), output
    restored = parse_markup(output, "xml")
    assert Counter(tags_of(restored)) == Counter(tags_of(markup))
    assert restored.text.split() == translation.split()  # the words, in order, escaped and back


@settings(max_examples=100, deadline=None)
@given(line=content())
def test_the_identity_alignment_gives_back_the_text_with_its_tags(line):
    markup = parse_markup(line, "xml")
    words = markup.text.split()
    output = restore_markup(markup, markup.text, [(i, i) for i in range(len(words))])
    assert parse_markup(output, "xml").text == markup.text
    assert Counter(tags_of(parse_markup(output, "xml"))) == Counter(tags_of(markup))


def test_tags_follow_their_words_across_reordering():
    markup = parse_markup('Der <b>rote</b> Hut <a href="x?a=1&amp;b=>2">gehört</a> ihr.', "xml")
    assert markup.text == "Der rote Hut gehört ihr."
    # "The hat belongs to her" with rot -> red inserted before hat: 0-0 1-1 2-2 3-3 4-5
    output = restore_markup(markup, "The red hat belongs to her.", [(0, 0), (1, 1), (2, 2), (3, 3), (4, 5)])
    assert output == 'The <b>red</b> hat <a href="x?a=1&amp;b=>2">belongs</a> to her.'
    swapped = restore_markup(markup, "hat red", [(1, 1), (2, 0)])
    assert swapped == 'hat <b>red</b> <a href="x?a=1&amp;b=>2"></a>'  # gehört has no word: empty, kept


def test_html_void_elements_self_closing_tags_and_entities():
    line = 'Hallo<br>Welt &amp; <img src="a.png" alt="x>y"> <x id="1"/>du'
    markup = parse_markup(line, "html")
    assert markup.text == "Hallo Welt & du"
    output = restore_markup(markup, "Hello world & you", [(0, 0), (1, 1), (2, 2), (3, 3)])
    assert output == 'Hello <br>world &amp; <img src="a.png" alt="x>y"><x id="1"/>you'
    assert strip_markup(output, "html") == "Hello world & you"


def test_a_line_without_text_keeps_its_tags():
    markup = parse_markup("<br/><b></b>", "xml")
    assert markup.text == ""
    assert restore_markup(markup, "", []) == "<br/><b></b>"


@pytest.mark.parametrize(
    ("line", "fmt", "message"),
    [
        ("<b>x", "xml", "element <b> is never closed"),
        ("x</b>", "html", "end tag </b> closes no open element"),
        ("<b><i>x</b></i>", "html", "end tag </b> closes <i>"),
        ("<p>one<p>two", "html", "element <p> is never closed"),
        ("a < b", "xml", "not well-formed XML at column"),
        ("<a href=x>y</a>", "xml", "not well-formed XML at column 9"),  # unquoted: HTML, not XML
    ],
)
def test_malformed_markup_is_a_markup_error(line, fmt, message):
    with pytest.raises(MarkupError, match=message):
        parse_markup(line, fmt)
