"""Inline markup: tags out and back in by word alignments (mtrain.decode.requests.markup), as a property
over random tag structures (every kind of node) and random alignments, the cases a user meets,
its cost at 100,000 tags, and `mtrain translate format=xml|html` with a tiny model."""

from __future__ import annotations

import os
import random
import re
import subprocess
import time
from collections import Counter
from pathlib import Path
from xml.parsers import expat

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtrain.decode.requests.markup import (
    CDATA_CLOSE,
    CDATA_OPEN,
    Markup,
    MarkupError,
    parse_markup,
    restore_markup,
    strip_markup,
    tags_of,
)
from tests.decoding_run import TRANSLATE_DECODE as DECODE
from tests.warm_process import run_mtrain

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


# ------------------------------------------------------------------ every kind of node, any size
HTML_ONLY_ENTITIES = {"&eacute;": "é", "&nbsp;": "\xa0"}
ENTITIES = {"&amp;": "&", "&lt;": "<", "&gt;": ">", "&quot;": '"', "&#228;": "ä", "&#xE4;": "ä"}
INSIDE_CDATA = st.text(alphabet="ab <>&'\"ä]", max_size=8).filter(lambda text: "]]>" not in text)
COMMENT_TEXT = st.text(alphabet="ab <>&ä-", max_size=6).filter(lambda text: "--" not in text and text[-1:] != "-")


@st.composite
def node_tree(draw, fmt: str, depth: int = 0) -> tuple[str, str]:
    """Random markup of `fmt` with elements, text, entities, CDATA, comments, processing
    instructions and point tags; and the plain text it holds, as the rules say (a point tag
    separates words, an element or CDATA boundary does not)."""
    line, text = [], []
    kinds = ["word", "word", "entity", "cdata", "comment", "pi", "point", "element"]
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(kinds if depth < 3 else kinds[:-1]))
        space = draw(st.sampled_from([" ", " ", ""]))
        if kind == "word":
            word = draw(WORDS)
            line.append(escape(word))
            text.append(word)
        elif kind == "entity":
            entities = {**ENTITIES, **(HTML_ONLY_ENTITIES if fmt == "html" else {})}
            entity = draw(st.sampled_from(sorted(entities)))
            line.append(entity)
            text.append(entities[entity])
        elif kind == "cdata":
            inside = draw(INSIDE_CDATA)
            line.append(f"<![CDATA[{inside}]]>")
            text.append(inside)
        elif kind in ("comment", "pi", "point"):
            if kind == "comment":  # (html's `<!-->` and `<!--->` are whole comments)
                line.append(f"<!--{draw(COMMENT_TEXT.filter(lambda text: not text.startswith(('>', '->'))))}-->")
            elif kind == "pi":  # html reads a PI up to its first `>`, xml up to `?>`
                line.append(f'<?pi x="{"a>b" if fmt == "xml" else "ab"}"?>')
            else:
                html_points = ["<br>", "<!x>", "</>", "</br>", "<!DOCTYPE html>"] if fmt == "html" else []
                line.append(draw(st.sampled_from([draw(tag(draw(NAMES))) + "/>", *html_points])))
            text.append(" ")
        else:
            name = draw(NAMES)
            inner_line, inner_text = draw(node_tree(fmt, depth + 1))
            line.append(f"{draw(tag(name))}>{inner_line}</{name}>")
            text.append(inner_text)
        line.append(space)
        text.append(space)
    return "".join(line), "".join(text)


def checked_output(output: str, fmt: str, source_tags: list[str]) -> Markup:
    """The output read back: well-formed (xml: by expat too) and with the source's tags."""
    if fmt == "xml":
        assert well_formed_xml(output), output
    restored = parse_markup(output, fmt)  # html: the same tokenizer, so the same tag sequence
    cdata = (CDATA_OPEN, CDATA_CLOSE)
    tags = Counter(tag for tag in tags_of(restored) if tag not in cdata)
    assert tags == Counter(tag for tag in source_tags if tag not in cdata), output
    return restored


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(), fmt=st.sampled_from(["xml", "html"]), seed=st.integers(0, 2**16), target_words=st.integers(0, 12)
)
def test_every_kind_of_node_keeps_its_text_once_and_the_output_well_formed(data, fmt, seed, target_words):
    line, text = data.draw(node_tree(fmt))
    markup = parse_markup(line, fmt)
    assert markup.text == " ".join(text.split())  # every character of text once: none lost, none doubled
    rng = random.Random(seed)
    # Output words with what needs escaping, in text and in CDATA (`]]>`).
    translation = " ".join(rng.choice(["w", "x&y", "z<", "q]]>r"]) + str(j) for j in range(target_words))
    num_src = len(markup.text.split())
    links = [(i, j) for i in range(num_src) for j in range(target_words) if rng.random() < 0.3]
    restored = checked_output(restore_markup(markup, translation, links), fmt, tags_of(markup))
    assert restored.text.split() == translation.split()


def test_1000_nested_elements_and_deep_trees_are_no_recursion():
    line = "<b>" * 1000 + "Hund" + "</b>" * 1000
    markup = parse_markup(line, "xml")
    assert restore_markup(markup, "dog", [(0, 0)]) == "<b>" * 1000 + "dog" + "</b>" * 1000
    deep = " ".join(f"<i>w{i}" for i in range(5000)) + "</i>" * 5000
    markup = parse_markup(deep, "html")
    assert restore_markup(markup, markup.text, [(i, i) for i in range(5000)]) == deep


@pytest.mark.parametrize("shape", ["flat", "nested", "points"])
def test_100000_tags_on_one_line_parse_and_place_in_linear_time(shape):
    """The time is the CPU time of this process: on a machine shared with the rest of the
    suite, wall time measures the other processes (scripts/bench_markup.py: 1k, 10k, 100k)."""
    line = {  # as restore_markup writes them: the identity alignment gives back the line
        "flat": " ".join(["<b>Wort</b>"] * 50_000),
        "nested": " ".join(["<b>Wort"] * 50_000) + "</b>" * 50_000,
        "points": " ".join(['<x id="1"/>Wort'] * 100_000),
    }[shape]
    cpu, wall = time.process_time(), time.perf_counter()
    markup = parse_markup(line, "xml")
    words = markup.text.split()
    output = restore_markup(markup, markup.text, [(i, i) for i in range(len(words))])
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    print(f"{shape}: 100,000 tags parsed and placed in {cpu:.3f} s CPU ({wall:.3f} s wall)")
    assert output == line
    assert cpu < 2.0


@pytest.mark.parametrize("fmt", ["xml", "html"])
def test_cdata_text_is_translated_and_written_back_in_cdata(fmt):
    markup = parse_markup("Ein <![CDATA[großer & <b>]]> Hund", fmt)
    assert markup.text == "Ein großer & <b> Hund"
    assert tags_of(markup) == [CDATA_OPEN, CDATA_CLOSE]
    output = restore_markup(markup, "A big & <b> dog", [(0, 0), (1, 1), (2, 2), (3, 3), (4, 4)])
    assert output == "A <![CDATA[big & <b>]]> dog"
    # A `]]>` in an output word cannot stand in one section: it is split across two.
    assert restore_markup(markup, "a ]]> b", [(1, 1)]) == "a <![CDATA[]]]]><![CDATA[>]]> b"
    assert well_formed_xml(restore_markup(markup, "a ]]> b", [(1, 1)]))


def test_processing_instructions_comments_and_declarations_are_kept_untranslated():
    markup = parse_markup('Ein <?pi x="a>b"?> Hund <!-- nicht übersetzen --> läuft', "xml")
    assert markup.text == "Ein Hund läuft"
    output = restore_markup(markup, "A dog runs", [(0, 0), (1, 1), (2, 2)])
    assert output == 'A <?pi x="a>b"?>dog <!-- nicht übersetzen -->runs'
    assert well_formed_xml(output)
    # html reads `<!x>`, `</>` and `<!DOCTYPE html>` as browsers do (comments), `</br>` as a
    # tag of its own, `<script>` as code: kept where they were, their text never translated.
    line = "<!DOCTYPE html>Ein <!x> Hund </> läuft </br>. <script>if (a<b) go();</script>"
    markup = parse_markup(line, "html")
    assert markup.text == "Ein Hund läuft ."
    output = restore_markup(markup, "A dog runs .", [(0, 0), (1, 1), (2, 2), (3, 3)])
    assert output == "<!DOCTYPE html>A <!x>dog </>runs </br>. <script>if (a<b) go();</script>"


def test_html_text_keeps_a_bare_ampersand_and_a_lone_less_than():
    """html.parser dropped the `&` of `AT&T` (an entity `&T` it could not decode)."""
    markup = parse_markup("AT&T <b>a < b</b> &amp; &eacute;", "html")
    assert markup.text == "AT&T a < b & é"
    assert restore_markup(markup, markup.text, [(i, i) for i in range(6)]) == "AT&amp;T <b>a &lt; b</b> &amp; é"


def test_a_line_break_is_refused_and_a_carriage_return_is_whitespace():
    """The contract of the markup path: one line is one sentence (serve answers 422)."""
    with pytest.raises(MarkupError, match=r"^a line break at column 11: markup is read one line at a time"):
        parse_markup("Hallo Welt\nEin <b>Hund</b> läuft .", "html")
    assert parse_markup("Hallo\rWelt <b>x</b>", "xml").text == "Hallo Welt x"
    assert parse_markup("<b>x</b>\r\n", "xml").text == "x"  # the line's own end


@pytest.mark.parametrize(
    ("line", "fmt", "message"),
    [
        (
            "a & b",
            "xml",
            "column 4: not well-formed (invalid token); the & at column 3 starts no entity: write a "
            "literal & as &amp; (or use format=html, which reads a bare & as text)",
        ),
        ("AT&T", "xml", "the & at column 3 starts no entity"),
        ("x <3", "xml", "the < at column 3 starts no tag: write a literal < as &lt;"),
        (
            "a &nbsp; b",
            "xml",
            "undefined entity; XML defines only &amp; &lt; &gt; &quot; &apos; and numeric "
            "references: write &nbsp; as &#160;, or use format=html",
        ),
        ("<!DOCTYPE x>", "xml", "a document type declaration at column 1 cannot be inside a line of format=xml"),
        ("a <b c", "html", "the tag at column 3 (<b c) never ends: close it with > (and any quote it opens)"),
        ('<a title="x>y', "html", "the tag at column 1"),
        ("a <!-- b", "html", "the comment at column 3 (<!-- b) never ends: close it with -->"),
        ("a <![CDATA[b", "xml", "the CDATA section at column 3 (<![CDATA[b) never ends: close it with ]]>"),
        ("a <?pi b", "xml", "the processing instruction at column 3 (<?pi b) never ends: close it with ?>"),
        ("a <script>b", "html", "<script> at column 3 is never closed: end it with </script>"),
    ],
)
def test_what_cannot_be_read_is_refused_where_it_is(line, fmt, message):
    with pytest.raises(MarkupError, match=re.escape(message)):
        parse_markup(line, fmt)


# ------------------------------------------------------------------ through `mtrain translate`
# The cases, one line each: deep nesting, CDATA, a PI with a quoted `>`, html's `<!x>` and `</>`.
COMMAND_LINES = {
    "xml": [
        "<b>" * 1000 + "Hund" + "</b>" * 1000,
        "Ein <![CDATA[großer & <b>]]> Hund.",
        'Ein <?pi x="a>b"?> Hund <!-- Tier --> läuft.',
    ],
    "html": [
        "Ein <!x> Hund </> läuft .",
        "Ein <![CDATA[großer]]> Hund.",
        "<!DOCTYPE html>" + "<i>" * 1000 + "Ein <br> Hund" + "</i>" * 1000,
    ],
}


def translate(run_dir: Path, cwd: Path, lines: list[str], *args: str) -> subprocess.CompletedProcess:
    source = cwd / "in.txt"
    source.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return run_mtrain("translate", f"run={run_dir}", f"input={source}", *DECODE, *args, cwd=cwd, env=env, timeout=120)


def test_translate_keeps_every_kind_of_node_and_translates_the_text_once(run_dir, tmp_path):
    plain_lines = [strip_markup(line, fmt) for fmt, lines in COMMAND_LINES.items() for line in lines]
    plain = translate(run_dir, tmp_path, plain_lines)
    assert plain.returncode == 0, plain.stderr.decode()
    expected = iter(plain.stdout.decode().splitlines())
    for fmt, lines in COMMAND_LINES.items():
        result = translate(run_dir, tmp_path, lines, f"format={fmt}")
        assert result.returncode == 0, result.stderr.decode()
        outputs = result.stdout.decode().splitlines()
        assert len(outputs) == len(lines)
        for source, output in zip(lines, outputs, strict=True):
            restored = checked_output(output, fmt, tags_of(parse_markup(source, fmt)))
            assert restored.text.split() == next(expected).split()  # the plain translation, once


@pytest.mark.parametrize(
    ("fmt", "lines", "message"),
    [
        (
            "xml",
            ["Ein Hund.", "Hund & Katze"],
            "in.txt:2: format=xml: not well-formed XML at column 7: not well-formed (invalid token); the & at "
            "column 6 starts no entity: write a literal & as &amp; (or use format=html, which reads a bare & as text)",
        ),
        ("xml", ["<!DOCTYPE x>Hund"], "in.txt:1: format=xml: a document type declaration at column 1 cannot be"),
        ("html", ["Ein <b Hund"], "in.txt:1: format=html: the tag at column 5 (<b Hund) never ends: close it with >"),
        ("html", ["Ein <!-- Hund"], "in.txt:1: format=html: the comment at column 5 (<!-- Hund) never ends"),
    ],
)
def test_translate_refuses_what_it_cannot_read_in_one_line(run_dir, tmp_path, fmt, lines, message):
    result = translate(run_dir, tmp_path, lines, f"format={fmt}")
    stderr = result.stderr.decode()
    assert result.returncode == 2, stderr
    assert any(message in line for line in stderr.splitlines()), stderr
    assert "Traceback" not in stderr
