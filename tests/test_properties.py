"""Property-based tests (hypothesis): arbitrary bytes as corpus lines and as translate input.

Whatever bytes arrive, mtrain either gets through or stops with the documented MtrainError;
never another exception. Corpora go through the whole preparation path (reading, repairs,
cleaning, encoding, the cache entry read back); translate input goes through
`translate_stream` with a file in and a file out, and keeps one output line per input line.
A tokenizer is trained once per module; the model is tiny and random (what it says is not
under test, only that every input line gets exactly one answer).
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path
from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from mtrain.batches import prepare_data
from mtrain.config import DataConfig, ModelConfig, TokenizerConfig, TranslateConfig
from mtrain.decode.text.stream import translate_stream
from mtrain.decode.text.textio import count_lines
from mtrain.errors import MtrainError
from mtrain.model import build_model
from mtrain.tokenizer import train_or_load_tokenizer

WORDS = [
    "der",
    "die",
    "das",
    "ein",
    "Hund",
    "Katze",
    "läuft",
    "schnell",
    "the",
    "a",
    "dog",
    "cat",
    "runs",
    "fast",
    "über",
    "猫",
    "straße",
]
SPLIT_FILES = {"train": "train", "valid": "val", "test": "test"}

# A line is made of pieces that each probe one kind of damage; `\n` never occurs inside a
# line (it is the separator), every other byte can.
DAMAGE = st.sampled_from(
    [
        b"\r",
        b"\t",
        b"\x00",
        b"\xef\xbb\xbf",
        b"\xff",
        b"\xc3",
        b"\xed\xa0\x80",  # CR, tab, NUL, BOM, bad UTF-8
        "\u2028".encode(),
        "\u0085".encode(),
        "\ufeff".encode(),
        b" ",
        b"\x0b\x0c\x1b",
    ]
)
WORD = st.sampled_from(WORDS).map(str.encode)
PIECE = st.one_of(
    WORD,
    WORD,
    WORD,
    WORD,
    WORD,
    WORD,  # mostly words, so that many corpora survive the filters
    DAMAGE,
    st.text(max_size=8).map(lambda text: text.encode("utf-8", "surrogatepass")),
    st.binary(max_size=8),
    st.builds(lambda word, n: word.encode() * n, st.sampled_from(WORDS), st.integers(100, 3000)),  # long lines
)
LINE = st.lists(PIECE, max_size=10).map(lambda pieces: b" ".join(pieces).replace(b"\n", b" "))


def file_bytes(lines: list[bytes], crlf: bool, bom: bool, final_newline: bool) -> bytes:
    end = b"\r\n" if crlf else b"\n"
    data = end.join(lines) + (end if final_newline and lines else b"")
    return (b"\xef\xbb\xbf" if bom else b"") + data


CLEAN_PAIRS = [(b"der Hund l\xc3\xa4uft", b"the dog runs"), (b"die Katze", b"the cat"), (b"ein Hund", b"a dog")]


@st.composite
def corpora(draw) -> dict:
    """{file name: bytes} for train/val/test in both languages: random lines around a few
    clean pairs (so that many corpora survive the filters); 1 split in 10 is misaligned."""
    files = {}
    for name in SPLIT_FILES.values():
        count = draw(st.integers(0, 6))
        other = count if draw(st.integers(0, 9)) else draw(st.integers(0, 6))
        sides = [draw(st.lists(LINE, min_size=n, max_size=n)) for n in (count, other)]
        at = draw(st.integers(0, min(count, other)))
        for side, lang in enumerate(("de", "en")):
            lines = sides[side][:at] + [pair[side] for pair in CLEAN_PAIRS] + sides[side][at:]
            files[f"{name}.{lang}"] = file_bytes(lines, draw(st.booleans()), draw(st.booleans()), draw(st.booleans()))
    return files


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("properties")


@pytest.fixture(scope="module")
def tokenizer(workspace):
    """A joint unigram model trained once on clean synthetic sentences."""
    rng = random.Random(0)
    corpus = workspace / "clean"
    corpus.mkdir()
    for name in SPLIT_FILES.values():
        for lang in ("de", "en"):
            lines = [" ".join(rng.choices(WORDS, k=rng.randint(2, 8))) for _ in range(200)]
            (corpus / f"{name}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    data = DataConfig(local_dir=str(corpus), cache_dir=str(workspace / "cache"))
    data.splits.test = "test"
    return train_or_load_tokenizer(TokenizerConfig(vocab_size=40), data, log=lambda _: None)


@pytest.fixture(scope="module")
def model(tokenizer):
    torch.manual_seed(0)
    cfg = ModelConfig(
        encoder_layers=1, decoder_layers=1, d_model=16, heads=2, ffn_dim=32, dropout=0.0, max_positions=64
    )
    return build_model(
        cfg, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, tokenizer.pad_id, joint_vocab=tokenizer.joint
    ).eval()


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(files=corpora(), invalid_utf8=st.sampled_from(["skip", "skip", "skip", "error"]))
def test_any_corpus_bytes_prepare_or_raise_the_documented_error(workspace, tokenizer, files, invalid_utf8):
    directory = Path(tempfile.mkdtemp(dir=workspace))
    for name, data in files.items():
        (directory / name).write_bytes(data)
    cfg = DataConfig(local_dir=str(directory), cache_dir=str(directory / "cache"), invalid_utf8=invalid_utf8)
    cfg.splits.test = "test"
    # The tokenizer is not under test here (and training one per example would be slow).
    with mock.patch("mtrain.batches.prepare.train_or_load_tokenizer", return_value=tokenizer):
        try:
            prepared = prepare_data(cfg, TokenizerConfig(vocab_size=40), log=lambda _: None)
        except MtrainError as error:
            event(f"MtrainError: {str(error).replace(str(directory), 'DIR')[:70]}")
            assert str(error) and "\n" not in str(error)  # noqa: PT017 - one line for the CLI
            return

    event("prepared")
    for split in ("valid", "test"):
        text = getattr(prepared, f"{split}_text")
        corpus = getattr(prepared, split)
        lines = files[f"{SPLIT_FILES[split]}.de"].count(b"\n") + 1  # at most; a final newline ends no line
        assert len(text.src) == len(text.tgt) == len(corpus) <= lines
        for sentence in text.src + text.tgt:
            assert "\x00" not in sentence and "\n" not in sentence and sentence == sentence.strip()
    assert 0 < len(prepared.train) <= files["train.de"].count(b"\n") + 1
    vocab = tokenizer.src_vocab_size
    for corpus in (prepared.train, prepared.valid, prepared.test):
        for i in range(len(corpus)):
            src, tgt = corpus.src(i), corpus.tgt(i)
            assert src[-1] == tokenizer.eos_id and len(src) == corpus.src_lengths[i]
            assert len(tgt) == corpus.tgt_lengths[i]
            assert all(0 <= int(token) < vocab for token in list(src) + list(tgt))


TRANSLATE_INPUT = st.builds(
    file_bytes, st.lists(LINE, max_size=8), crlf=st.booleans(), bom=st.booleans(), final_newline=st.booleans()
) | st.binary(max_size=300)  # or any bytes at all, newlines included


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(data=TRANSLATE_INPUT, nbest=st.sampled_from([1, 2]))
def test_any_translate_input_gives_one_output_line_per_input_line(workspace, tokenizer, model, data, nbest):
    directory = Path(tempfile.mkdtemp(dir=workspace))
    (directory / "input.txt").write_bytes(data)
    cfg = OmegaConf.merge(
        OmegaConf.structured(TranslateConfig),
        {
            "input": str(directory / "input.txt"),
            "output": str(directory / "output.txt"),
            "max_input_tokens": 32,
            "decode": {"beam": 2, "nbest": nbest, "max_len_a": 0.0, "max_len_b": 4},
        },
    )
    with torch.inference_mode():
        report = translate_stream(model, tokenizer, cfg, torch.device("cpu"), "fp32")

    expected = count_lines(str(directory / "input.txt"))
    assert report.lines == expected
    output = (directory / "output.txt").read_bytes().decode("utf-8")  # always valid UTF-8
    rows = output.split("\n")
    assert rows[-1] == ""
    if nbest == 1:
        assert len(rows) - 1 == expected
    else:  # n-best TSV: every input line, in order, with 1..nbest rows (a blank line has one)
        indices = [int(row.split("\t")[0]) for row in rows[:-1]]
        assert sorted(indices) == indices and set(indices) == set(range(expected))
        assert all(indices.count(i) <= nbest for i in range(expected))
