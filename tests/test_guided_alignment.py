"""Guided alignment: the file's links as subword targets, the loss, and the refusals (through
`mtrain fit`); cleaning drops a pair's alignment with it; off, training is unchanged."""

from __future__ import annotations

import math
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from mtrain.batches.corpus import EncodedCorpus
from mtrain.batches.guided_alignment import guided_alignments_from
from mtrain.config import ModelConfig
from mtrain.errors import MtrainError
from mtrain.model import build_model
from mtrain.train.loss import GuidedHead, TranslationLoss, alignment_loss
from tests.warm_process import run_mtrain

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny models

REPO = Path(__file__).resolve().parents[1]
EOS = 3
# Token ids 10..19 start a word (a "▁" piece), 20..29 continue one.
STARTS = np.array([10 <= i < 20 for i in range(30)])


def corpus_of(pairs):
    return EncodedCorpus.from_sequences([[*s, EOS] for s, _ in pairs], [t for _, t in pairs])


def test_word_links_become_the_links_of_all_their_pieces():
    # source: word 0 = pieces 0,1; word 1 = piece 2. target: word 0 = piece 0; word 1 = pieces 1,2.
    corpus = corpus_of([([10, 20, 11], [12, 13, 21])])
    guided = guided_alignments_from(["0-1 1-0"], "a.align", corpus, np.array([0]), 1, STARTS, STARTS)
    targets = guided.targets(np.array([0]), src_width=4, tgt_width=4)[0]
    expected = torch.zeros(4, 4)
    expected[0, 2] = 1.0  # target piece 0 (word 0) <- source word 1 (piece 2)
    expected[1, :2] = 0.5  # target pieces 1, 2 (word 1) <- source word 0 (pieces 0, 1), normalised
    expected[2, :2] = 0.5
    assert torch.equal(targets, expected)  # row 3 (EOS) and the eos column stay 0


def test_each_kept_pair_reads_its_own_line_and_dummy_rows_are_empty():
    corpus = corpus_of([([10], [11]), ([10, 11], [12, 13])])
    lines = ["0-0", "this line's pair was dropped by cleaning", "1-0 0-1"]
    guided = guided_alignments_from(lines, "a.align", corpus, np.array([0, 2]), 3, STARTS, STARTS)
    targets = guided.targets(np.array([1, -1]), src_width=3, tgt_width=3)
    assert targets[0, 0, 1] == 1.0 and targets[0, 1, 0] == 1.0 and targets[0].sum() == 2.0
    assert targets[1].sum() == 0.0


@pytest.mark.parametrize(
    ("lines", "kept", "limited", "message"),
    [
        (["0-0"], [0], False, "a.align has 1 lines, the training corpus 2"),
        (["0-0", "0-0", "0-0"], [0], False, "a.align has 3 lines, the training corpus 2"),
        (["0-0", "0-2"], [1], False, "a.align:2: link 0-2 is out of range: the pair has 1 source and 1 target words"),
        (["0-0", "0:0"], [1], False, "a.align:2: '0:0' is not a Pharaoh link"),
    ],
)
def test_a_bad_file_is_refused_naming_file_and_line(lines, kept, limited, message):
    corpus = corpus_of([([10], [11])])
    with pytest.raises(MtrainError, match=message):
        guided_alignments_from(lines, "a.align", corpus, np.array(kept), 2, STARTS, STARTS, limited=limited)


def test_more_lines_than_read_are_fine_when_train_limit_stopped_the_reading():
    corpus = corpus_of([([10], [11])])
    guided = guided_alignments_from(["0-0", "0-0", "x"], "a.align", corpus, np.array([0]), 1, STARTS, STARTS, True)
    assert guided.targets(np.array([0]), 2, 2)[0, 0, 0] == 1.0


def test_alignment_loss_is_the_cross_entropy_of_the_rows():
    alignment = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 0.5, 0.5], [0.0, 0.0, 0.0]]])
    uniform = torch.full((1, 3, 3), 1 / 3)
    # two aligned rows, each -sum(a log(1/3)) = log 3; the unaligned row costs nothing
    assert alignment_loss(uniform, alignment).item() == pytest.approx(2 * math.log(3), rel=1e-6)
    matching = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 0.5, 0.5], [0.2, 0.3, 0.5]]])
    assert alignment_loss(matching, alignment).item() == pytest.approx(-math.log(0.5), abs=1e-6)


def _model():
    torch.manual_seed(0)
    cfg = ModelConfig(encoder_layers=2, decoder_layers=2, d_model=32, heads=2, ffn_dim=64, dropout=0.0)
    return build_model(cfg, 30, 30, 1, joint_vocab=True)


def _batch():
    src = torch.tensor([[10, 20, 11, EOS], [12, EOS, 1, 1]])
    tgt_in = torch.tensor([[2, 13, 14], [2, 15, 1]])
    tgt_out = torch.tensor([[13, 14, EOS], [15, EOS, 1]])
    alignment = torch.zeros(2, 3, 4)
    alignment[0, 0, 0] = alignment[0, 1, 2] = alignment[1, 0, 0] = 1.0
    return src, src.eq(1), tgt_in, tgt_out, alignment


def test_guided_loss_adds_the_weighted_head_cross_entropy_and_weight_zero_changes_nothing():
    model = _model()
    src, mask, tgt_in, tgt_out, alignment = _batch()
    plain = TranslationLoss(model, 1, 0.1)
    loss, nll = plain(src, mask, tgt_in, tgt_out, 5)
    plain_grads = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)

    off = TranslationLoss(model, 1, 0.1, guided=GuidedHead(layer=-2, head=1, weight=0.0))
    loss_off, nll_off = off(src, mask, tgt_in, tgt_out, 5, alignment)
    off_grads = torch.autograd.grad(loss_off, list(model.parameters()), allow_unused=True)
    assert torch.equal(loss_off, loss) and torch.equal(nll_off, nll)  # bit for bit
    for a, b in zip(plain_grads, off_grads, strict=True):
        assert (a is None and b is None) or torch.equal(a, b)

    guided = TranslationLoss(model, 1, 0.1, guided=GuidedHead(layer=-2, head=1, weight=0.5))
    loss_on, nll_on = guided(src, mask, tgt_in, tgt_out, 5, alignment)
    _, attention = model.decoder_states_and_attention(src, mask, tgt_in, layer=0)
    assert torch.equal(nll_on, nll)
    assert loss_on.item() == pytest.approx(loss.item() + 0.5 * alignment_loss(attention[:, 1], alignment).item())


def test_training_the_guided_head_moves_its_attention_to_the_alignment():
    model = _model()
    src, mask, tgt_in, tgt_out, alignment = _batch()
    network = TranslationLoss(model, 1, 0.1, guided=GuidedHead(layer=1, head=0, weight=1.0))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)

    def head_loss() -> float:
        with torch.no_grad():
            _, attention = model.decoder_states_and_attention(src, mask, tgt_in, layer=1)
            return alignment_loss(attention[:, 0], alignment).item()

    before = head_loss()
    for _ in range(30):
        optimizer.zero_grad()
        network(src, mask, tgt_in, tgt_out, 5, alignment)[0].backward()
        optimizer.step()
    assert head_loss() < 0.2 * before


# ----------------------------------------------------------------- through `mtrain fit`

TINY = [
    "model.encoder_layers=2",
    "model.decoder_layers=2",
    "model.d_model=32",
    "model.heads=2",
    "model.ffn_dim=64",
    "tokenizer.vocab_size=400",
    "train.max_tokens=1024",
    "train.num_threads=1",
    "train.precision=fp32",
    "train.max_updates=6",
    "train.validate_every=6",
    "train.valid_bleu=false",
    "decode.beam=1",
    "decode.max_len_b=3",
    "decode.max_len_a=1.0",
]


def fit(*overrides, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return run_mtrain("fit", *TINY, *overrides, text=True, cwd=cwd, env=env, timeout=300)


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory, multi30k_slice) -> Path:
    """The slice with train cut to 300 pairs, two of them dropped by cleaning (a duplicate and
    an empty target; with data.clean.deduplicate), and their word alignments (identity links up to the shorter side)."""
    directory = tmp_path_factory.mktemp("guided")
    de = (multi30k_slice / "train.de").read_text(encoding="utf-8").splitlines()[:300]
    en = (multi30k_slice / "train.en").read_text(encoding="utf-8").splitlines()[:300]
    de[5], en[5] = de[4], en[4]  # a duplicate: dropped by deduplication
    en[7] = ""  # dropped as empty
    for split in ("val", "test_2016_flickr"):
        for lang in ("de", "en"):
            (directory / f"{split}.{lang}").write_text(
                (multi30k_slice / f"{split}.{lang}").read_text(encoding="utf-8"), encoding="utf-8"
            )
    (directory / "train.de").write_text("\n".join(de) + "\n", encoding="utf-8")
    (directory / "train.en").write_text("\n".join(en) + "\n", encoding="utf-8")
    links = [
        " ".join(f"{i}-{i}" for i in range(min(len(s.split()), len(t.split())))) for s, t in zip(de, en, strict=True)
    ]
    (directory / "train.align").write_text("\n".join(links) + "\n", encoding="utf-8")
    return directory


def test_fit_trains_with_guidance_dropped_pairs_drop_their_alignment_and_eval_aligns(corpus_dir, tmp_path):
    # Line 8's target is empty: its link "" is fine. If line identity were lost after the two
    # dropped pairs, later pairs would read their neighbours' links and some would be out of range.
    links = (corpus_dir / "train.align").read_text(encoding="utf-8").splitlines()
    long_line = max(range(10, 300), key=lambda n: len(links[n].split()))
    result = fit(
        f"data.local_dir={corpus_dir}",
        f"data.cache_dir={corpus_dir / 'cache'}",  # shared: one tokenizer and encoding for the module
        f"train.guided_alignment={corpus_dir / 'train.align'}",
        "data.clean.deduplicate=true",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "update 6" in (tmp_path / "run" / "train.log").read_text(encoding="utf-8")
    lines = np.fromfile(next((corpus_dir / "cache").rglob("line.numbers")), dtype=np.uint64)
    assert 5 not in lines and 7 not in lines and len(lines) == 298 and long_line in lines

    # eval writes the alignments of its hypotheses beside them (the guided head's, by default)
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    command = ["eval", f"run={tmp_path / 'run'}", "decode.alignment=true", "decode.beam=1", f"out={tmp_path / 'ev'}"]
    result = run_mtrain(*command, text=True, env=env, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    hyps = (tmp_path / "ev" / "test.hyp").read_text(encoding="utf-8").splitlines()
    links = (tmp_path / "ev" / "test.align").read_text(encoding="utf-8").splitlines()
    sources = (corpus_dir / "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()
    assert len(links) == len(hyps) == len(sources) == 100
    for source, hyp, line in zip(sources, hyps, links, strict=True):
        for link in line.split():
            i, j = map(int, link.split("-"))
            assert i < len(source.split()) and j < len(hyp.split())


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda links: links[:-1], "has 299 lines, the training corpus 300"),
        (lambda links: [*links[:20], "0-0 99-0", *links[21:]], r"train.align:21: link 99-0 is out of range"),
    ],
)
def test_fit_refuses_a_bad_alignment_file_before_training(corpus_dir, tmp_path, edit, message):
    links = (corpus_dir / "train.align").read_text(encoding="utf-8").splitlines()
    bad = tmp_path / "train.align"
    bad.write_text("\n".join(edit(links)) + "\n", encoding="utf-8")
    result = fit(
        f"data.local_dir={corpus_dir}",
        f"data.cache_dir={corpus_dir / 'cache'}",  # shared: one tokenizer and encoding for the module
        f"train.guided_alignment={bad}",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()  # refused before training


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["train.guided_alignment=/no/such.align"], "train.guided_alignment: /no/such.align is not a file"),
        (["train.guided_alignment_layer=2"], "train.guided_alignment_layer: 2 is not a layer of the 2-layer decoder"),
        (["train.guided_alignment_head=-3"], "train.guided_alignment_head: -3 is not one of the 2 heads"),
        (["data.subword_sampling.alpha=0.5"], "train.guided_alignment: not with data.subword_sampling"),
    ],
)
def test_fit_refuses_guidance_it_cannot_do_before_any_work(corpus_dir, tmp_path, overrides, message):
    result = fit(
        f"data.local_dir={corpus_dir}",
        f"train.guided_alignment={corpus_dir / 'train.align'}",
        *overrides,
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert message in result.stderr
    assert not (tmp_path / "run").exists()
