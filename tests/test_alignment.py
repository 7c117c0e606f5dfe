"""Word alignments from cross-attention (`decode.alignment`), and `mtrain translate` with
alignments and inline markup (`format=xml|html`) end to end."""

from __future__ import annotations

import itertools
import os
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from mtrain.checkpoint.files import save_checkpoint
from mtrain.config import DecodeConfig, FitConfig, ModelConfig, TranslateConfig, to_plain
from mtrain.decode.requests.markup import parse_markup, tags_of
from mtrain.decode.search.hypothesis import Hypothesis
from mtrain.decode.text.stream import translate_stream
from mtrain.decode.translation.alignment import (
    Aligner,
    pharaoh,
    piece_links,
    resolve_alignment_source,
    to_words,
    word_indices,
)
from mtrain.decode.translation.translator import translate_encoded, translate_sentences
from mtrain.errors import MtrainError
from mtrain.model import build_model
from tests.decoding_run import TINY_MODEL
from tests.warm_process import run_mtrain

MODEL = TINY_MODEL  # the shared `model` fixture's (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny models
SENTENCES = ["Zwei junge Männer stehen vor einem Gebäude.", "Ein Hund.", "Ein Mann fährt Fahrrad."]


# ------------------------------------------------------------------ pieces and words
def test_words_are_what_split_counts():
    assert word_indices(["▁Ein", "▁Hund", "e", "."]) == [0, 1, 1, 1]
    assert word_indices(["▁", "(", "a", ")", "▁b"]) == [0, 0, 0, 0, 1]  # a lone ▁ joins the next word
    assert word_indices(["▁A", "▁", "▁", "▁s", "s"]) == [0, 1, 1, 1, 1]  # "A   ss".split(): 2 words
    assert word_indices(["▁a", "▁"]) == [0, -1]  # a trailing space belongs to no word


def test_piece_links_take_the_strongest_attention_by_row_column_or_both():
    # rows: 3 target pieces + EOS; columns: a tag, 3 source pieces, eos
    attention = torch.tensor(
        [
            [0.0, 0.1, 0.2, 0.6, 0.1],
            [0.9, 0.0, 0.05, 0.0, 0.05],  # the tag column is not a source word: ignored
            [0.0, 0.7, 0.1, 0.1, 0.1],
            [0.0, 0.0, 0.0, 0.0, 1.0],  # EOS row: ignored
        ]
    )
    links = piece_links(attention, num_src=3, num_tgt=3, src_offset=1, rule="target")
    assert links == [(0, 2), (1, 1), (2, 0)]
    words = to_words(links, ["▁Ein", "▁Hund", "e"], ["▁A", "▁do", "g"])
    assert words == [(0, 1), (1, 0), (1, 1)]
    assert pharaoh(words) == "0-1 1-0 1-1"
    # each source piece to the target piece attending to it most: column argmax
    assert piece_links(attention, num_src=3, num_tgt=3, src_offset=1, rule="source") == [(0, 2), (1, 0), (2, 0)]
    assert piece_links(attention, 3, 3, 1, rule="union") == [(0, 2), (1, 0), (1, 1), (2, 0)]


class HandSetAttention:
    """An engine whose outputs copy the source and attend as `permutation` says: target
    piece t attends to source piece permutation[t] (the known alignment)."""

    def __init__(self, permutation) -> None:
        self.permutation = permutation

    def translate_batch(self, sources, cfg, attention_layer=None):
        assert attention_layer is not None  # alignments ask for attention
        results = []
        for ids in sources:
            tokens = list(ids[:-1])
            attention = torch.zeros(len(tokens) + 1, len(ids))
            for t in range(len(tokens)):
                attention[t, self.permutation(t, len(tokens))] = 1.0
            attention[-1, -1] = 1.0
            results.append([Hypothesis(tokens=tokens, score=0.0, attention=attention)])
        return results


def test_known_attention_gives_known_word_alignments(tokenizer):
    sources = [tokenizer.encode_src(s) + [tokenizer.eos_id] for s in SENTENCES]
    cfg = DecodeConfig(alignment="word")
    copied = translate_encoded(HandSetAttention(lambda t, n: t), tokenizer, sources, cfg, "cpu")
    reversed_ = translate_encoded(HandSetAttention(lambda t, n: n - 1 - t), tokenizer, sources, cfg, "cpu")
    for sentence, (copy,), (mirror,) in zip(SENTENCES, copied, reversed_, strict=True):
        n = len(sentence.split())
        assert copy.text == sentence
        assert copy.alignment == [(i, i) for i in range(n)]
        # reversed pieces: the first target word from the last source word and back, and no
        # link crosses another in the monotone direction
        assert (n - 1, 0) in mirror.alignment and (0, n - 1) in mirror.alignment
        by_target = sorted(mirror.alignment, key=lambda link: (link[1], -link[0]))
        assert all(a[0] >= b[0] for a, b in itertools.pairwise(by_target))
        assert copy.attention is None  # not asked for: not kept
    subword = translate_encoded(
        HandSetAttention(lambda t, n: t), tokenizer, sources, DecodeConfig(alignment="subword"), "cpu"
    )
    assert subword[0][0].alignment == [(i, i) for i in range(len(sources[0]) - 1)]


def test_alignments_leave_the_translations_as_they_were(model, tokenizer):
    cfg = DecodeConfig(beam=3, nbest=2, max_len_a=0.5, max_len_b=3)
    plain = translate_sentences(model, tokenizer, SENTENCES, cfg, "cpu")
    aligned = translate_sentences(
        model, tokenizer, SENTENCES, DecodeConfig(**{**cfg.__dict__, "alignment": "word"}), "cpu"
    )
    for hyps, hyps_aligned in zip(plain, aligned, strict=True):
        assert [(h.tokens, h.score) for h in hyps] == [(h.tokens, h.score) for h in hyps_aligned]
        assert all(h.alignment is None for h in hyps)
        for hyp in hyps_aligned:
            words = len(hyp.text.split())
            assert all(0 <= j < words for _, j in hyp.alignment)


def test_one_head_of_one_layer_is_that_head_s_attention(model, tokenizer):
    src = torch.tensor([tokenizer.encode_src(SENTENCES[0]) + [tokenizer.eos_id]])
    mask = src.eq(tokenizer.pad_id)
    memory = model.encode(src, mask)
    prev = torch.tensor([tokenizer.bos_id])
    _, mean = model.decode_step(prev, model.start_decoding(memory, mask), True, 0)
    heads = [model.decode_step(prev, model.start_decoding(memory, mask), True, f"0:{h}")[1] for h in range(4)]
    assert torch.allclose(torch.stack(heads).mean(dim=0), mean, atol=1e-6)
    assert not torch.allclose(heads[0], heads[1])
    with pytest.raises(MtrainError, match="the cross-attention has 4 heads"):
        model.decode_step(prev, model.start_decoding(memory, mask), True, "0:4")


def test_pictures_and_alignments_together_read_their_own_layers(model, tokenizer):
    source = tokenizer.encode_src(SENTENCES[1]) + [tokenizer.eos_id]
    cfg = DecodeConfig(beam=2, max_len_a=0.5, max_len_b=3, alignment="word", alignment_layer=0)
    aligner = Aligner.of(cfg, tokenizer, "last")
    assert aligner is not None and aligner.attention_layer == "all"
    (hyp,) = translate_encoded(model, tokenizer, [source], cfg, "cpu", attention_layer="last")[0]
    (alone,) = translate_encoded(model, tokenizer, [source], cfg, "cpu")[0]
    (picture,) = translate_encoded(
        model, tokenizer, [source], DecodeConfig(beam=2, max_len_a=0.5, max_len_b=3), "cpu", attention_layer="last"
    )[0]
    assert hyp.alignment == alone.alignment
    assert torch.allclose(hyp.attention, picture.attention)


def test_where_alignments_come_from_by_default():
    guided = OmegaConf.create(
        {"train": {"guided_alignment": "a.align", "guided_alignment_layer": 1, "guided_alignment_head": 2}}
    )
    plain = OmegaConf.create({"train": {"guided_alignment": None}})
    cases = [
        (plain, False, (None, None)),  # Aligner's default: the penultimate layer's average
        (guided, False, (1, 2)),  # the head guided alignment trained
        (plain, True, (-1, None)),  # CTranslate2's only attention, whatever the run
        (guided, True, (-1, None)),
    ]
    for run_config, ctranslate2, expected in cases:
        decode = DecodeConfig()  # alignment off: filled anyway (markup and serve's requests align)
        resolve_alignment_source(decode, run_config, ctranslate2, used=False)
        assert (decode.alignment_layer, decode.alignment_head) == expected
    chosen = DecodeConfig(alignment="word", alignment_layer=0)
    resolve_alignment_source(chosen, guided, False)
    assert (chosen.alignment_layer, chosen.alignment_head) == (0, None)  # what the user set stays


# ------------------------------------------------------------------ the command
def mtrain(*args: str, stdin: bytes = b"", cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return run_mtrain(*args, input=stdin, cwd=cwd, env=env, timeout=120)


DECODE = ["decode.beam=2", "decode.max_len_a=0.5", "decode.max_len_b=3", "num_threads=1"]


def job(**overrides) -> TranslateConfig:
    decode = overrides.pop("decode", {})
    cfg = OmegaConf.structured(TranslateConfig)
    cfg.decode = OmegaConf.merge(cfg.decode, {"beam": 2, "max_len_a": 0.5, "max_len_b": 3, **decode})
    return OmegaConf.merge(cfg, overrides)


def stream(model, tokenizer, tmp_path, lines, **overrides) -> list[str]:
    source, output = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    translate_stream(
        model, tokenizer, job(input=str(source), output=str(output), **overrides), torch.device("cpu"), "fp32"
    )
    return output.read_text(encoding="utf-8").split("\n")[:-1]


def test_translate_writes_text_tab_alignment_and_the_same_text(model, tokenizer, tmp_path):
    lines = [*SENTENCES, ""]
    plain = stream(model, tokenizer, tmp_path, lines)
    rows = stream(model, tokenizer, tmp_path, lines, decode={"alignment": "true"})
    assert [row.split("\t")[0] for row in rows] == plain
    for source, row in zip(SENTENCES, rows, strict=False):
        output, links = row.split("\t")
        for link in links.split():
            i, j = map(int, link.split("-"))
            assert i < len(source.split()) and j < len(output.split())
    assert rows[-1] == "\t"  # the blank line: no text, no links


def test_translate_puts_the_tags_back(model, tokenizer, tmp_path):
    lines = ['Ein <b>Mann</b> mit <a href="x?a=1&amp;b=>2">rotem Hut</a>.<br/>', "<x id='1'/>", "Ein &amp; Hund."]
    outputs = stream(model, tokenizer, tmp_path, lines, format="xml")
    assert len(outputs) == 3
    for source, output in zip(lines, outputs, strict=True):
        assert Counter(tags_of(parse_markup(output, "xml"))) == Counter(tags_of(parse_markup(source, "xml")))


@pytest.mark.parametrize(
    ("fmt", "lines", "message"),
    [
        ("html", ["<p>open"], "in.txt:1: format=html: element <p> is never closed"),
        ("xml", ["fine", "a & b"], "in.txt:2: format=xml: not well-formed XML at column 4"),
    ],
)
def test_malformed_markup_names_the_file_and_line(model, tokenizer, tmp_path, fmt, lines, message):
    with pytest.raises(MtrainError, match=message):
        stream(model, tokenizer, tmp_path, lines, format=fmt)


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (["format=xml"], b"ok\n<b>bad\n", "stdin:2: format=xml: element <b> is never closed"),
        (["format=md"], b"x\n", "format: 'md' must be one of text|xml|html"),
        (
            ["format=xml", "decode.alignment=subword"],
            b"x\n",
            "format=xml: markup puts its tags back by word alignments",
        ),
        (["decode.alignment=maybe"], b"x\n", "decode.alignment=maybe: choose true (= word), word, subword or false"),
        (
            ["engine=ctranslate2", "decode.alignment=true", "decode.alignment_layer=0"],
            b"x\n",
            "CTranslate2 gives the last layer's attention averaged over heads only",
        ),
    ],
)
def test_translate_refuses_in_one_line(run_dir, tmp_path, args, stdin, message):
    result = mtrain("translate", f"run={run_dir}", *DECODE, *args, stdin=stdin, cwd=tmp_path)
    assert result.returncode == 2
    stderr = result.stderr.decode()
    assert message in stderr and "Traceback" not in stderr


@pytest.fixture(scope="module")
def one_layer_run(tmp_path_factory, tokenizer) -> Path:
    """A run of a 1-layer decoder, with the config.yaml `mtrain fit` writes."""
    directory = tmp_path_factory.mktemp("one_layer_run")
    tokenizer.save(directory / "tokenizer")
    cfg = ModelConfig(**{**MODEL, "decoder_layers": 1})
    torch.manual_seed(0)
    model = build_model(cfg, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, tokenizer.pad_id, joint_vocab=True)
    config = to_plain(OmegaConf.structured(FitConfig(model=cfg)))
    (directory / "config.yaml").write_text(OmegaConf.to_yaml(config), encoding="utf-8")
    save_checkpoint(directory / "checkpoints" / "best.pt", {"model": model.state_dict(), "config": config, "update": 7})
    return directory


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["decode.alignment=true"],
            "decode.alignment_layer: null reads layer -2 (the penultimate) for alignments, and run=",
        ),
        (["format=html"], "decode.alignment_layer: null reads layer -2 (the penultimate) for format=html"),
        (["decode.alignment=word", "decode.alignment_layer=1"], "decode.alignment_layer: 1 is not a layer of run="),
        (["decode.alignment=true", "decode.alignment_layer=-1", "decode.alignment_head=4"], "decode.alignment_head: 4"),
    ],
)
def test_a_layer_the_decoder_lacks_is_refused_before_the_model_loads(one_layer_run, tmp_path, args, message):
    """Issue 49, item 12: named as the user's key, from the run's config.yaml (the checkpoint
    moved away: nothing is loaded before the refusal)."""
    (one_layer_run / "checkpoints" / "best.pt").rename(tmp_path / "best.pt")
    try:
        result = mtrain("translate", f"run={one_layer_run}", *DECODE, *args, stdin=b"Ein Hund.\n", cwd=tmp_path)
    finally:
        (tmp_path / "best.pt").rename(one_layer_run / "checkpoints" / "best.pt")
    stderr = result.stderr.decode()
    assert result.returncode == 2 and len(stderr.strip().splitlines()) == 1, stderr
    assert stderr.startswith(f"mtrain: error: {message}"), stderr


def test_a_one_layer_decoder_aligns_with_its_last_layer(one_layer_run, tmp_path):
    result = mtrain(
        "translate", f"run={one_layer_run}", *DECODE, "format=html", "decode.alignment_layer=-1",
        stdin=b"Ein <b>Hund</b>.\n", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr.decode()
    assert Counter(tags_of(parse_markup(result.stdout.decode().strip(), "html"))) == Counter(["<b>", "</b>"])


def test_ctranslate2_alignments_equal_the_torch_engine_s_last_layer(run_dir, model, tokenizer, tmp_path):
    pytest.importorskip("ctranslate2")
    decode = {"alignment": "true", "beam": 1}
    torch_rows = stream(model, tokenizer, tmp_path, SENTENCES, decode={**decode, "alignment_layer": -1})
    text = ("\n".join(SENTENCES) + "\n").encode()
    args = [f"decode.{key}={value}" for key, value in {**decode, "max_len_a": 0.5, "max_len_b": 3}.items()]
    ct2_run = mtrain(
        "translate", f"run={run_dir}", *args, "engine=ctranslate2", "precision=fp32", stdin=text, cwd=tmp_path
    )
    assert ct2_run.returncode == 0, ct2_run.stderr.decode()
    assert ct2_run.stdout.decode().split("\n")[:-1] == torch_rows  # (null layer: CTranslate2's last)
