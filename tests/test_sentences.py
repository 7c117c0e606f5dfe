"""mtrain.evaluate.sentences: per-sentence scores, their TSV and the worst lines."""

from __future__ import annotations

import re

import pytest
from sacrebleu.metrics import BLEU, CHRF

from mtrain.evaluate.report import worst_lines_markdown
from mtrain.evaluate.sentences import per_sentence_record, score_sentences, worst_lines, write_sentences_tsv

HYPS = ["a man plays the guitar .", "two dogs run", "", "the cat sits on a mat", "a woman"]
REFS = [
    "a man is playing the guitar .",
    "two dogs are running in the park",
    "a child",
    "the cat sits on the mat",
    "A woman",
]
SOURCES = ["ein Mann spielt Gitarre .", "zwei Hunde rennen", "", "die Katze sitzt auf der Matte", "eine Frau"]


@pytest.mark.parametrize("tokenize, lowercase, word_order", [("13a", False, 0), ("intl", True, 2)])
def test_scores_are_sacrebleus_sentence_scores_with_the_corpus_settings(tokenize, lowercase, word_order):
    rows = score_sentences(HYPS, [REFS], SOURCES, [-0.5, -1.0, None, -0.2, -2.0], tokenize, lowercase, word_order)
    bleu = BLEU(tokenize=tokenize, lowercase=lowercase, effective_order=True)
    chrf = CHRF(word_order=word_order, lowercase=lowercase)
    assert [row.line for row in rows] == [1, 2, 3, 4, 5]
    assert [row.bleu for row in rows] == [bleu.sentence_score(h, [r]).score for h, r in zip(HYPS, REFS, strict=True)]
    assert [row.chrf for row in rows] == [chrf.sentence_score(h, [r]).score for h, r in zip(HYPS, REFS, strict=True)]
    assert (rows[4].bleu == pytest.approx(100.0)) is lowercase  # "a woman" against "A woman"
    assert rows[2].bleu == 0.0
    assert [row.model_score for row in rows] == [-0.5, -1.0, None, -0.2, -2.0]


def test_several_references_score_each_line_against_all():
    second = ["a man plays the guitar .", "two dogs run", "a child", "a cat", "a woman"]
    rows = score_sentences(HYPS, [REFS, second])
    bleu = BLEU(effective_order=True)
    assert [row.bleu for row in rows] == [
        bleu.sentence_score(h, [a, b]).score for h, a, b in zip(HYPS, REFS, second, strict=True)
    ]
    assert rows[0].references == [REFS[0], second[0]] and rows[0].source == "" and rows[0].model_score is None


def test_worst_lines_are_the_lowest_bleu_first():
    rows = score_sentences(HYPS, [REFS])
    worst = worst_lines(rows, 3)
    assert len(worst) == 3
    assert [row.bleu for row in worst] == sorted(row.bleu for row in rows)[:3]
    assert max(row.bleu for row in worst) <= min(row.bleu for row in rows if row not in worst)
    assert worst[0].line == 3  # the empty hypothesis
    assert worst_lines(rows, 0) == [] and len(worst_lines(rows, 50)) == len(rows)


def test_tsv_has_a_header_and_escapes_tabs_and_line_breaks(tmp_path):
    hyps = ["tab\there", "line\nbreak", "back\\slash and \\t literally", "cr\rhere"]
    refs = ["tab here", "line break", "back slash", "cr here"]
    rows = score_sentences(hyps, [refs], ["q\tw", "", "", ""], [-1.23456, None, None, -0.5])
    path = tmp_path / "test.sentences.tsv"
    write_sentences_tsv(path, rows)
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    assert lines[-1] == "" and len(lines) == len(hyps) + 2  # header, one line per row, final newline
    assert lines[0] == "line\tbleu\tchrf\tmodel_score\tsource\thypothesis\treference"
    fields = [line.split("\t") for line in lines[1:-1]]
    assert all(len(f) == 7 for f in fields)
    assert fields[0][4:6] == ["q\\tw", "tab\\there"] and fields[1][5] == "line\\nbreak"
    assert fields[2][5] == "back\\\\slash and \\\\t literally" and fields[3][5] == "cr\\rhere"
    assert fields[0][3] == "-1.2346" and fields[1][3] == ""
    assert [float(f[1]) for f in fields] == pytest.approx([row.bleu for row in rows], abs=5e-5)
    # Read back, the escapes undo to the text itself.
    unescape = {"\\\\": "\\", "\\t": "\t", "\\n": "\n", "\\r": "\r"}
    assert [re.sub(r"\\.", lambda m: unescape[m.group(0)], f[5]) for f in fields] == hyps


def test_markdown_lists_the_worst_lines_escaped(tmp_path):
    hyps = ["a | b *bold* <b>x</b> [link](u) `code` \\ _u_", "a man plays the guitar ."]
    rows = score_sentences(hyps, [["c d", "a man plays the guitar ."]], ["x\ny", "q"], [-1.5, -0.1])
    record = per_sentence_record(tmp_path / "test.sentences.tsv", rows, 1)
    markdown = "\n".join(worst_lines_markdown(record))
    assert str(tmp_path / "test.sentences.tsv") in markdown
    table_rows = [line for line in markdown.splitlines() if line.startswith("| 1 |")]
    assert len(table_rows) == 1 and "| 2 |" not in markdown  # worst_lines=1: the worst only
    assert "a \\| b \\*bold\\* \\<b\\>x\\</b\\> \\[link\\](u) \\`code\\` \\\\ \\_u\\_" in table_rows[0]
    assert "| x y |" in table_rows[0] and "| -1.50 |" in table_rows[0]
