"""mtrain.evaluate.metrics: scores and signatures equal the `sacrebleu` command line's."""

from __future__ import annotations

import importlib.util
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from sacrebleu.metrics import BLEU, CHRF, TER

from mtrain.errors import MtrainError
from mtrain.evaluate import metrics as metrics_module
from mtrain.evaluate.metrics import METRIC_NAMES, score_corpus, score_files, score_stream
from mtrain.evaluate.references import read_reference_files
from tests.word_lists import ENGLISH_WORDS

SACREBLEU = str(Path(sys.executable).parent / "sacrebleu")

WORDS = ENGLISH_WORDS


def make_sentences(rng: random.Random, count: int) -> list[str]:
    sentences = []
    for _ in range(count):
        words = [rng.choice(WORDS) for _ in range(rng.randint(3, 14))]
        punctuation = rng.choice([".", ".", "!", "?", ", too."])
        sentences.append(" ".join(words).capitalize() + punctuation)
    return sentences


def perturb(rng: random.Random, sentence: str, rate: float) -> str:
    """Substitute, drop and re-case words at `rate` (a system of some quality)."""
    out = []
    for word in sentence.split():
        roll = rng.random()
        if roll < rate / 3:
            continue
        if roll < 2 * rate / 3:
            word = rng.choice(WORDS)
        elif roll < rate:
            word = word.upper()
        out.append(word)
    return " ".join(out)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    rng = random.Random(7)
    root = tmp_path_factory.mktemp("metrics")
    refs = make_sentences(rng, 150)
    files = {
        "ref": refs,
        "ref2": [perturb(rng, sentence, 0.15) for sentence in refs],
        "hyp": [perturb(rng, sentence, 0.35) for sentence in refs],
    }
    paths = {}
    for name, lines in files.items():
        paths[name] = root / f"{name}.txt"
        paths[name].write_text("\n".join(lines) + "\n", encoding="utf-8")
    return paths


def sacrebleu_cli(refs: list[Path], hyp: Path, *options: str) -> dict:
    """{metric name: (score, signature)} as `sacrebleu -f json -w 4` prints them."""
    command = [
        SACREBLEU,
        *map(str, refs),
        "-i",
        str(hyp),
        "-m",
        "bleu",
        "chrf",
        "ter",
        "-f",
        "json",
        "-w",
        "4",
        *options,
    ]
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return {entry["name"]: (entry["score"], entry["signature"]) for entry in json.loads(output)}


def ours(result: dict) -> dict:
    return {values["name"]: (round(values["score"], 4), values["signature"]) for values in result.values()}


@pytest.mark.parametrize(
    ("kwargs", "cli_options"),
    [
        ({}, ()),
        ({"chrf_word_order": 2}, ("--chrf-word-order", "2")),
        ({"lowercase": True, "tokenize": "intl"}, ("-lc", "--chrf-lowercase", "-tok", "intl")),
        ({"tokenize": "zh"}, ("-tok", "zh")),
    ],
    ids=["defaults", "chrf++", "lowercase-intl", "zh"],
)
def test_scores_and_signatures_equal_the_command_line(corpus, kwargs, cli_options):
    expected = sacrebleu_cli([corpus["ref"]], corpus["hyp"], *cli_options)
    got = ours(score_files(corpus["hyp"], [corpus["ref"]], **kwargs))
    assert got == expected
    assert set(got) == {"BLEU", "chrF2++" if kwargs.get("chrf_word_order") else "chrF2", "TER"}


def test_multiple_references_equal_the_command_line(corpus):
    expected = sacrebleu_cli([corpus["ref"], corpus["ref2"]], corpus["hyp"])
    got = ours(score_files(corpus["hyp"], [corpus["ref"], corpus["ref2"]]))
    assert got == expected
    assert "nrefs:2" in got["BLEU"][1]
    # A second, closer reference can only raise BLEU.
    single = score_files(corpus["hyp"], [corpus["ref"]], metrics=["bleu"])
    assert got["BLEU"][0] > single["bleu"]["score"]


def test_score_corpus_in_memory_matches_files(corpus):
    hyps = corpus["hyp"].read_text(encoding="utf-8").splitlines()
    refs = corpus["ref"].read_text(encoding="utf-8").splitlines()
    result = score_corpus(hyps, [refs], metrics=["bleu", "chrf"])
    assert set(result) == {"bleu", "chrf"}
    assert result["bleu"]["score"] == score_files(corpus["hyp"], [corpus["ref"]])["bleu"]["score"]
    assert result["bleu"]["text"].startswith(f"BLEU|{result['bleu']['signature']} = ")
    assert score_corpus(refs, [refs], metrics=["bleu"])["bleu"]["score"] == pytest.approx(100.0)


def test_unknown_metric_lists_the_known_ones(corpus):
    with pytest.raises(MtrainError) as error:
        score_files(corpus["hyp"], [corpus["ref"]], metrics=["bleu", "meteor"])
    assert "'meteor'" in str(error.value)
    for name in METRIC_NAMES:
        assert name in str(error.value)


def test_unknown_tokenizer_is_a_clear_error(corpus):
    with pytest.raises(MtrainError, match="tokenize='moses'.*13a"):
        score_files(corpus["hyp"], [corpus["ref"]], tokenize="moses")


def test_ja_mecab_without_mecab_says_what_to_install(corpus):
    if importlib.util.find_spec("MeCab") is not None:
        pytest.skip("MeCab is installed here")
    with pytest.raises(MtrainError, match=r"sacrebleu\[ja\]"):
        score_files(corpus["hyp"], [corpus["ref"]], tokenize="ja-mecab")


def test_line_count_mismatch_is_refused_where_the_shorter_file_ends(corpus, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("only one line\nand two\n", encoding="utf-8")
    with pytest.raises(MtrainError) as error:
        score_files(short, [corpus["ref"]])
    assert str(error.value).startswith(f"hyp={short} has 2 lines but ref={corpus['ref']} has more;")
    # The longer file is not read on: a line past the end of the shorter that would fail is never reached.
    long_ref = tmp_path / "long.txt"
    long_ref.write_bytes(b"one\ntwo\nthree\n\xff not UTF-8\n" + b"x" * 5_000 + b"\n")
    with pytest.raises(MtrainError, match=rf"^hyp={short} has 2 lines but ref={long_ref} has more"):
        score_files(short, [long_ref], max_chars=100)
    with pytest.raises(MtrainError, match=rf"^ref={short} has 2 lines but hyp={long_ref} has more"):
        score_files(long_ref, [short], max_chars=100)
    with pytest.raises(MtrainError, match=rf"^ref={short} has 2 lines but ref={long_ref} has more"):
        read_reference_files([str(long_ref), str(short)], max_chars=100)


def test_streamed_scores_equal_sacrebleus_whole_corpus_scores(corpus, monkeypatch):
    """Statistics summed over chunks (7 lines here: 22 chunks, the last short) score as
    sacreBLEU's corpus_score of all lines at once, with two references."""
    hyps = corpus["hyp"].read_text(encoding="utf-8").splitlines()
    refs = [corpus["ref"].read_text(encoding="utf-8").splitlines(), list(reversed(hyps))]
    monkeypatch.setattr(metrics_module, "STREAM_CHUNK", 7)
    scores, count = score_stream(zip(hyps, zip(*refs, strict=True), strict=True), METRIC_NAMES, chrf_word_order=2)
    assert count == len(hyps) == 150
    whole = {"bleu": BLEU(), "chrf": CHRF(word_order=2), "ter": TER()}
    for name, metric in whole.items():
        expected = metric.corpus_score(hyps, refs)
        assert scores[name]["score"] == pytest.approx(expected.score, abs=1e-9)
        assert scores[name]["text"] == expected.format(signature=metric.get_signature().format())


def test_a_line_over_max_line_chars_is_refused_naming_the_file_line_and_key(tmp_path):
    hyp, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    hyp.write_text("a dog\n" + "ü" * 50 + "\n" + "a cat\n", encoding="utf-8")  # 50 characters, 100 bytes
    ref.write_text("a dog\n" + "ü" * 50 + "\n" + "a cat runs" + "!" * 41 + "\n", encoding="utf-8")
    assert score_files(hyp, [hyp], ["chrf"], max_chars=50)["chrf"]["score"] == 100.0  # (50 "ü" pass)
    with pytest.raises(MtrainError) as error:
        score_files(hyp, [ref], max_chars=50)
    assert str(error.value).startswith(f"ref={ref}:3: a line of more than 50 characters (max_line_chars=50)")
    assert "\n" not in str(error.value)


def test_empty_hypothesis_file(corpus, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(MtrainError, match=r"empty\.txt.*empty file"):
        score_files(empty, [corpus["ref"]])


def test_missing_files(corpus, tmp_path):
    with pytest.raises(MtrainError, match=r"hyp=.*nope\.txt: no such file"):
        score_files(tmp_path / "nope.txt", [corpus["ref"]])
    with pytest.raises(MtrainError, match=r"ref=.*nope\.txt: no such file"):
        score_files(corpus["hyp"], [tmp_path / "nope.txt"])
    with pytest.raises(MtrainError, match="no reference given"):
        score_files(corpus["hyp"], [])
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    with pytest.raises(MtrainError, match=r"hyp=.*run: a directory, not a text file; to score a run, use run=DIR"):
        score_files(tmp_path / "run", [corpus["ref"]])


def test_eval_app_scores_a_file_and_reports_errors_in_one_line(corpus, capsys, monkeypatch, tmp_path):
    from mtrain.cli import main as cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(
        sys,
        "argv",
        ["mtrain", "eval", f"hyp={corpus['hyp']}", f"ref={corpus['ref']},{corpus['ref2']}", "chrf_word_order=2"],
    )
    cli.main()
    printed = capsys.readouterr().out
    expected = sacrebleu_cli([corpus["ref"], corpus["ref2"]], corpus["hyp"], "--chrf-word-order", "2")
    for name, (score, signature) in expected.items():
        assert f"{score:.2f}" in printed and signature in printed, name
    assert list(tmp_path.iterdir()) == []  # no stray Hydra output directories

    monkeypatch.setattr(
        sys, "argv", ["mtrain", "eval", f"hyp={corpus['hyp']}", f"ref={corpus['ref']}", "metrics=[bleu,rouge]"]
    )
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code == 2
    assert "unknown metric 'rouge'" in capsys.readouterr().err
