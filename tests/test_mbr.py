"""MBR decoding (mtrain.decode.selection.mbr), its utility matrix (mtrain.decode.selection.utility) and epsilon
sampling: the matrix equals sacreBLEU's sentence scores, the choice a brute-force one, one
candidate comes back as it is, a seed repeats its output; eval's TSV and serve's answer carry
the expected utility; without MBR decoding takes the engine's path alone."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import sacrebleu
import torch
from omegaconf import OmegaConf

from mtrain.checkpoint.files import load_run
from mtrain.config import DecodeConfig, EvalConfig, MbrCandidates, MbrConfig, MbrUtility, Sampling, with_values
from mtrain.decode.search.hypothesis import Hypothesis
from mtrain.decode.search.sampling import truncate_distribution
from mtrain.decode.selection import selecting as selection_module
from mtrain.decode.selection.mbr import expected_utilities, rank_by_expected_utility
from mtrain.decode.selection.utility import bleu_matrix, chrf_matrix
from mtrain.decode.translation.translator import translate_sentences
from tests.conftest import train_spm_tokenizer
from tests.decoding_run import SHORT, write_config, write_test_run
from tests.decoding_run import TEST_SENTENCES as SENTENCES

CPU = torch.device("cpu")
WORDS = [
    "a",
    "man",
    "in",
    "red",
    "shirt",
    "is",
    "walking",
    "down",
    "the",
    "street",
    ",",
    ".",
    "dog",
    "dogs",
    "über",
    "Straße",
    "ein",
    "Mann",
    "!",
    "children",
    "'s",
    "play",
]


def random_sentences(rng: random.Random, count: int) -> list[str]:
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 12))) for _ in range(count)]


@pytest.fixture(scope="module")
def run(tmp_path_factory, data_dir) -> Path:
    """A de->en run of a tiny untrained model (its outputs vary: a fine test of choices)."""
    root = tmp_path_factory.mktemp("mbr_runs")
    tokenizer = train_spm_tokenizer(root / "spm", data_dir, 0)
    return write_config(write_test_run(root / "deen", tokenizer, seed=0, update=3), "de", "en")


@pytest.fixture(scope="module")
def loaded(run):
    return load_run(run, device=CPU)


def mbr_cfg(**mbr) -> DecodeConfig:
    return DecodeConfig(beam=2, **SHORT, mbr=MbrConfig(**mbr))


def test_chrf_matrix_equals_sacrebleu_sentence_chrf():
    rng = random.Random(3)
    hyps, refs = random_sentences(rng, 25), random_sentences(rng, 15) + [""]
    expected = np.array([[sacrebleu.sentence_chrf(h, [r]).score for r in refs] for h in hyps])
    assert np.abs(chrf_matrix(hyps, refs) - expected).max() < 1e-9


def test_bleu_matrix_equals_sacrebleu_sentence_bleu():
    rng = random.Random(4)
    hyps = random_sentences(rng, 25) + ["", "a", "a man"]
    refs = random_sentences(rng, 15) + hyps[:3]
    expected = np.array([[sacrebleu.sentence_bleu(h, [r]).score for r in refs] for h in hyps])
    assert np.abs(bleu_matrix(hyps, refs) - expected).max() < 1e-9


@pytest.mark.parametrize("utility", [MbrUtility.chrf, MbrUtility.bleu])
def test_selection_equals_a_brute_force_reference(utility):
    """Expected utility = the mean sentence score over the references, every draw counted."""
    score = sacrebleu.sentence_chrf if utility == MbrUtility.chrf else sacrebleu.sentence_bleu
    rng = random.Random(5)
    for _ in range(4):
        texts = random_sentences(rng, 6)
        refs = texts + rng.sample(texts, 3)  # repeated draws weigh more
        brute = [sum(score(h, [r]).score for r in refs) / len(refs) for h in texts]
        ranked = rank_by_expected_utility(
            [Hypothesis(tokens=[i], score=0.0, text=t) for i, t in enumerate(texts)], refs, utility
        )
        assert ranked[0].tokens == [int(np.argmax(brute))]  # the first best on ties, as argmax
        assert [h.expected_utility for h in sorted(ranked, key=lambda h: h.tokens)] == pytest.approx(brute)
        assert expected_utilities(texts, refs, utility) == pytest.approx(brute)


def test_ties_keep_the_candidates_order():
    hyps = [Hypothesis(tokens=[i], score=0.0, text="same words") for i in range(3)]
    assert [h.tokens for h in rank_by_expected_utility(hyps, ["other"], "chrf")] == [[0], [1], [2]]


def test_epsilon_truncation_cuts_the_tail_and_keeps_the_best():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.04, 0.01], [0.01] * 4 + [0.96]]))
    kept = torch.isfinite(truncate_distribution(logits, epsilon=0.05))
    assert kept.tolist() == [[True, True, True, False, False], [False] * 4 + [True]]
    flat = torch.linspace(0.0, 0.1, 100).unsqueeze(0)  # every token below epsilon: the best survives
    assert torch.isfinite(truncate_distribution(flat, epsilon=0.5)).nonzero()[:, 1].tolist() == [99]


@pytest.mark.parametrize("candidates", [MbrCandidates.beam, MbrCandidates.sample])
def test_mbr_with_one_candidate_returns_it(loaded, candidates):
    cfg = mbr_cfg(candidates=candidates, num_candidates=1)
    plain = (
        with_values(cfg, beam=1, mbr=MbrConfig())
        if candidates == MbrCandidates.beam
        else with_values(cfg, sampling=Sampling.epsilon, beam=1, mbr=MbrConfig())
    )
    chosen = translate_sentences(loaded.model, loaded.tokenizer, SENTENCES, cfg, CPU, "fp32")
    alone = translate_sentences(loaded.model, loaded.tokenizer, SENTENCES, plain, CPU, "fp32")
    assert [h[0].tokens for h in chosen] == [h[0].tokens for h in alone]
    assert all(h[0].expected_utility is not None for h in chosen)


def test_mbr_returns_the_highest_expected_utility_and_a_seed_repeats_it(loaded):
    cfg = mbr_cfg(candidates=MbrCandidates.both, num_candidates=6, num_pseudo_refs=5)
    cfg = with_values(cfg, nbest=3)
    first = translate_sentences(loaded.model, loaded.tokenizer, SENTENCES, cfg, CPU, "fp32")
    again = translate_sentences(loaded.model, loaded.tokenizer, SENTENCES, cfg, CPU, "fp32")
    assert [[(h.text, h.expected_utility) for h in hyps] for hyps in first] == [
        [(h.text, h.expected_utility) for h in hyps] for hyps in again
    ]
    for hyps in first:
        assert len(hyps) <= 3
        utilities = [h.expected_utility for h in hyps]
        assert utilities == sorted(utilities, reverse=True)


def test_mbr_decodes_an_ensemble(run, tmp_path):
    from mtrain.config import Engine
    from mtrain.export.engine import open_engine

    engine = open_engine(run, Engine.torch, CPU, "fp32", ensemble=[str(run)])
    cfg = mbr_cfg(candidates=MbrCandidates.sample, num_candidates=4)
    hyps = translate_sentences(engine.model, engine.tokenizer, SENTENCES, cfg, CPU, "fp32")
    assert all(h[0].expected_utility is not None for h in hyps)


def test_without_mbr_or_reranking_the_engine_decodes_alone(loaded, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("SelectingEngine used without decode.mbr or decode.rerank")

    monkeypatch.setattr(selection_module.SelectingEngine, "__init__", refuse)
    for cfg in (DecodeConfig(beam=2, nbest=2, **SHORT), DecodeConfig(sampling=Sampling.epsilon, nbest=2, **SHORT)):
        hyps = translate_sentences(loaded.model, loaded.tokenizer, SENTENCES, cfg, CPU, "fp32")
        assert all(h.expected_utility is None and h.rerank_score is None for sentence in hyps for h in sentence)


def test_eval_per_sentence_tsv_has_the_expected_utility(run, tmp_path):
    from mtrain.cli.evaluate import evaluate_run

    cfg = OmegaConf.to_object(
        OmegaConf.merge(
            OmegaConf.structured(EvalConfig),
            {
                "run": str(run),
                "out": str(tmp_path),
                "device": "cpu",
                "precision": "fp32",
                "metrics": ["bleu"],
                "per_sentence": True,
                "decode": {**SHORT, "mbr": {"candidates": "sample", "num_candidates": 3}},
            },
        )
    )
    evaluate_run(cfg, log=lambda line: None)
    rows = [line.split("\t") for line in (tmp_path / "test.sentences.tsv").read_text().splitlines()]
    assert rows[0][:5] == ["line", "bleu", "chrf", "model_score", "expected_utility"]
    assert len(rows) == 1 + len(SENTENCES)
    assert all(0.0 <= float(row[4]) <= 100.0 for row in rows[1:])


def test_serve_answers_with_the_expected_utility():
    from mtrain.serve.app import response_body

    hyps = [[Hypothesis(tokens=[5], score=-1.0, text="a", expected_utility=42.0)]]
    assert response_body(hyps, 1)["expected_utilities"] == [42.0]
    plain = response_body([[Hypothesis(tokens=[5], score=-1.0, text="a")]], 1)
    assert set(plain) == {"translations", "scores"}  # unchanged without MBR


def test_mbr_decodes_with_ctranslate2(run):
    """CTranslate2 draws the candidates (top-p: it has no epsilon sampling). Its generator is
    seeded once per process and thread, so a second call in the same process draws others (the
    same command run again repeats its output: docs/TRANSLATE.md)."""
    pytest.importorskip("ctranslate2")
    from mtrain.config import Engine
    from mtrain.export.engine import open_engine

    engine = open_engine(run, Engine.ctranslate2, CPU, "fp32", 1)
    cfg = with_values(mbr_cfg(candidates=MbrCandidates.both, num_candidates=4), sampling=Sampling.topp, nbest=2)
    chosen = translate_sentences(engine.model, engine.tokenizer, SENTENCES, cfg, CPU, engine.precision)
    for hyps in chosen:
        assert 1 <= len(hyps) <= 2 and len({h.text for h in hyps}) == len(hyps)
        utilities = [h.expected_utility for h in hyps]
        assert None not in utilities and utilities == sorted(utilities, reverse=True)


def test_serve_requests_may_ask_for_up_to_num_candidates():
    from mtrain.config import ServeConfig
    from mtrain.serve.app import Rejected, TranslateRequest, request_decoding

    cfg = ServeConfig(decode=DecodeConfig(mbr=MbrConfig(candidates=MbrCandidates.sample, num_candidates=8)))
    assert request_decoding(TranslateRequest(text=["a"], nbest=8), cfg).nbest == 8  # above beam 5
    with pytest.raises(Rejected, match="above decode.mbr.num_candidates=8"):
        request_decoding(TranslateRequest(text=["a"], nbest=9), cfg)


def test_the_mbr_preset_composes_and_passes_the_checks():
    from hydra import compose, initialize_config_dir

    from mtrain.config import register_configs
    from mtrain.config_checks import check_config

    register_configs()
    configs = Path(__file__).resolve().parents[1] / "configs"
    with initialize_config_dir(config_dir=str(configs), version_base="1.3"):
        cfg = compose(config_name="translate", overrides=["decode=mbr_chrf", "run=somewhere"])
    check_config(cfg)
    assert cfg.decode.mbr.candidates == MbrCandidates.beam and cfg.decode.mbr.utility == MbrUtility.chrf
    assert cfg.decode.beam == DecodeConfig().beam  # beam 5's other settings, as decode=beam5
