"""n-best reranking (mtrain.decode.selection.rerank, mtrain.decode.selection.selecting) and the refusals of MBR
and reranking settings: the forward score alone keeps the beam's order, the reverse feature is
the reverse model's teacher-forced log-probability, tuning repeats itself, and every bad
setting is one line and exit status 2 from the `mtrain` command, before a model loads."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from mtrain.checkpoint.files import load_run
from mtrain.config import DecodeConfig, MbrCandidates, MbrConfig, RerankConfig
from mtrain.decode.engines.engine import as_engine
from mtrain.decode.selection.rerank import (
    TOKEN_LOG_PROB_FLOOR,
    FeatureScorer,
    RerankWeights,
    sequence_log_probs,
    tune_weights,
    write_weights,
)
from mtrain.decode.selection.selecting import SelectingEngine
from tests.conftest import train_spm_tokenizer
from tests.decoding_run import SHORT, write_config, write_test_run
from tests.decoding_run import TEST_SENTENCES as SENTENCES
from tests.warm_process import run_mtrain, run_python

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, data_dir) -> dict[str, Path]:
    """deen (forward), ende (its reverse), ende_other (another tokenizer), deen2 (a second de->en)."""
    root = tmp_path_factory.mktemp("rerank_runs")
    shared = train_spm_tokenizer(root / "spm", data_dir, 0)
    other = train_spm_tokenizer(root / "spm_other", data_dir, 5000)
    return {
        "deen": write_config(write_test_run(root / "deen", shared, seed=0, update=3), "de", "en"),
        "ende": write_config(write_test_run(root / "ende", shared, seed=1, update=3), "en", "de"),
        "ende_other": write_config(write_test_run(root / "ende_other", other, seed=2, update=3), "en", "de"),
        "deen2": write_config(write_test_run(root / "deen2", shared, seed=3, update=3), "de", "en"),
    }


def weights_file(path: Path, **weights: float) -> str:
    write_weights(path, RerankWeights(list(weights), list(weights.values())))
    return str(path)


def encoded(tokenizer, sentences=SENTENCES) -> list[list[int]]:
    return [tokenizer.encode_src(s) + [tokenizer.eos_id] for s in sentences]


def test_forward_weight_alone_keeps_the_beam_order(runs, tmp_path):
    loaded = load_run(runs["deen"], device=CPU)
    weights = weights_file(tmp_path / "w.json", forward=1.0, reverse=0.0, second=0.0, length_ratio=0.0)
    rerank = RerankConfig(weights=weights, reverse_run=str(runs["ende"]), second_run=str(runs["deen2"]))
    cfg = DecodeConfig(beam=4, nbest=4, **SHORT, rerank=rerank)
    engine = as_engine(loaded.model, loaded.tokenizer, CPU)
    sources = encoded(loaded.tokenizer)
    beam = engine.translate_batch(sources, DecodeConfig(beam=4, nbest=4, **SHORT))
    reranked = SelectingEngine(engine, loaded.tokenizer, cfg, CPU).translate_batch(sources, cfg)
    assert [[h.tokens for h in hyps] for hyps in reranked] == [[h.tokens for h in hyps] for hyps in beam]
    assert all(h.rerank_score == pytest.approx(h.score) for hyps in reranked for h in hyps)


def test_reverse_feature_is_the_teacher_forced_log_probability(runs):
    forward, reverse = load_run(runs["deen"], device=CPU), load_run(runs["ende"], device=CPU)
    tok = forward.tokenizer
    cfg = DecodeConfig(beam=3, nbest=3, **SHORT, rerank=RerankConfig(reverse_run=str(runs["ende"])))
    sources = encoded(tok)
    nbest = as_engine(forward.model, tok, CPU).translate_batch(sources, DecodeConfig(beam=3, nbest=3, **SHORT))
    scorer = FeatureScorer(cfg, CPU)
    features = scorer(tok, sources, nbest)
    column = scorer.features.index("reverse")
    for source, hyps, values in zip(sources, nbest, features, strict=True):
        target = source[:-1]  # the German source, without its eos, is the reverse model's output
        for hyp, value in zip(hyps, values[:, column], strict=True):
            # One pair at a time, step by step: sum of log p(target_t | hypothesis, target_<t).
            src = torch.tensor([[*hyp.tokens, tok.eos_id]])
            total = 0.0
            for t, token in enumerate([*target, tok.eos_id]):
                prefix = torch.tensor([[tok.bos_id, *target[:t]]])
                with torch.no_grad():
                    logits = reverse.model(src, src.eq(tok.pad_id), prefix)[0, -1]
                total += max(float(torch.log_softmax(logits.float(), dim=-1)[token]), TOKEN_LOG_PROB_FLOOR)
            assert value * (len(target) + 1) == pytest.approx(total, rel=1e-4, abs=1e-4)


def test_a_token_the_scorer_never_emits_counts_the_floor():
    """A run with a restricted output vocabulary gives -inf to the pieces outside it."""

    def model(src, padding, tgt_in):  # uniform over 4 tokens, token 3 never emitted
        logits = torch.zeros(*tgt_in.shape, 4)
        logits[..., 3] = float("-inf")
        return logits

    scores = sequence_log_probs(model, [[1, 2]], [[0, 3, 0]], pad_id=9, bos_id=1, eos_id=2)
    assert scores == pytest.approx([3 * np.log(1 / 3) + TOKEN_LOG_PROB_FLOOR])  # 0, 0 and eos; 3 floored


def test_reranking_reorders_mbr_candidates_with_their_utility(runs, tmp_path):
    loaded = load_run(runs["deen"], device=CPU)
    weights = weights_file(tmp_path / "w.json", forward=0.0, length_ratio=0.0, mbr=1.0)
    mbr = MbrConfig(candidates=MbrCandidates.sample, num_candidates=4)
    cfg = DecodeConfig(nbest=4, **SHORT, mbr=mbr, rerank=RerankConfig(weights=weights))
    engine = as_engine(loaded.model, loaded.tokenizer, CPU)
    hyps = SelectingEngine(engine, loaded.tokenizer, cfg, CPU).translate_batch(encoded(loaded.tokenizer), cfg)
    for sentence in hyps:  # mbr weight 1 alone: the expected utility's order
        assert [h.rerank_score for h in sentence] == pytest.approx([h.expected_utility / 100 for h in sentence])


def test_tuning_is_deterministic_and_never_below_the_decoded_order():
    rng = np.random.default_rng(0)
    texts = [[f"word{rng.integers(20)} w{rng.integers(5)} end" for _ in range(4)] for _ in range(30)]
    features = [rng.normal(size=(4, 3)) for _ in texts]
    references = [f"word{rng.integers(20)} w{rng.integers(5)} end" for _ in texts]
    names = ["forward", "reverse", "length_ratio"]
    first = tune_weights(features, texts, references, names, trials=40, seed=7)
    again = tune_weights(features, texts, references, names, trials=40, seed=7)
    assert first[0].weights == again[0].weights and first[1] == again[1]
    decoded_order = tune_weights(features, texts, references, names, trials=1)
    assert decoded_order[0].weights == [1.0, 0.0, 0.0] and first[1] >= decoded_order[1]


def test_tuning_script_writes_weights_the_decoder_takes(runs, tmp_path):
    """scripts/tune_rerank.py on the run's split, twice: the same file; `mtrain eval` reads it."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = tmp_path / "w.json"
    data = runs["deen"] / "data"
    (data / "valid.src").write_text("".join(s + "\n" for s in SENTENCES), encoding="utf-8")
    (data / "valid.ref").write_text("Two young men.\nA dog.\nA man rides a bike.\n", encoding="utf-8")
    command = [
        str(Path(__file__).resolve().parents[1] / "scripts" / "tune_rerank.py"),
        f"run={runs['deen']}",
        f"decode.rerank.reverse_run={runs['ende']}",
        "decode.beam=3",
        "decode.max_len_a=0.5",
        "decode.max_len_b=3",
        "trials=20",
        f"out={out}",
    ]
    first = run_python(*command, text=True, env=env, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    written = json.loads(out.read_text())
    assert written["features"] == ["forward", "reverse", "length_ratio"] and written["weights"][0] == 1.0
    # It says what it does as it goes (it was silent for minutes on a real validation set).
    said = [line for line in first.stderr.splitlines() if line.startswith("tune_rerank: ")]
    assert said[0] == "tune_rerank: decoding 3 sentences of valid (the whole beam of 3 each, 1 thread(s))", said
    assert "scoring the features forward, reverse, length_ratio" in said[1] and "scored 1/3 sentences" in said[2]
    assert [line for line in said if "searching the weights (20 seeded trials" in line]
    assert [line for line in said if "searched 10/20 weight trials" in line]
    assert set(written["seconds"]) == {"decode", "features", "search"}
    # A decode preset, as `mtrain translate decode=mbr_chrf` reads it: MBR's candidates, reranked.
    mbr = run_python(
        *command[:3], "decode=mbr_chrf", "decode.mbr.num_candidates=3", *command[4:], text=True, env=env, timeout=300
    )
    assert mbr.returncode == 0, mbr.stderr[-2000:]
    assert json.loads(out.read_text())["features"] == ["forward", "reverse", "length_ratio", "mbr"]
    second = run_python(*command, text=True, env=env, timeout=300)
    assert second.returncode == 0, second.stderr[-2000:]
    assert json.loads(out.read_text())["weights"] == written["weights"]


def test_tuning_script_help_and_presets(capsys):
    """`--help` prints the usage (it said `unknown key`); `decode=PRESET` reads configs/decode/."""
    import importlib.util

    from mtrain.errors import MtrainError

    spec = importlib.util.spec_from_file_location(
        "tune_rerank", Path(__file__).resolve().parents[1] / "scripts" / "tune_rerank.py"
    )
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--help"]) == 0
    assert "Keys: run, out, split" in capsys.readouterr().out
    assert script.decode_preset("mbr_chrf")["mbr"]["candidates"] == "beam"
    with pytest.raises(MtrainError, match="decode=mbr_chrff: no such preset .* mbr_chrf"):
        script.decode_preset("mbr_chrff")


def mtrain(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    return run_mtrain(*args, text=True, cwd=cwd, env=env, timeout=120)


def assert_refused(result: subprocess.CompletedProcess, expected: str) -> None:
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("mtrain: error:") and expected in lines[0], result.stderr


def test_bad_settings_are_refused_in_one_line_before_a_model_loads(runs, tmp_path):
    source = tmp_path / "in.de"
    source.write_text("Ein Hund.\n", encoding="utf-8")
    deen = f"run={runs['deen']}"
    weights = weights_file(tmp_path / "w.json", forward=1.0, length_ratio=0.5)
    with_reverse = weights_file(tmp_path / "wr.json", forward=1.0, reverse=0.3, length_ratio=0.5)
    huge = weights_file(tmp_path / "huge.json", forward=1.0, length_ratio=1e308)
    cases = [
        (["translate", deen, f"input={source}", "decode.mbr.candidates=sample", "decode.mbr.num_candidates=0"],
         "decode.mbr.num_candidates: 0 must be in 1..1024"),
        (["translate", deen, f"input={source}", "decode.mbr.candidates=sample", "decode.mbr.num_candidates=10000"],
         "decode.mbr.num_candidates: 10000 must be in 1..1024"),
        (["translate", deen, f"input={source}", f"decode.rerank.reverse_run={runs['deen2']}", f"decode.rerank.weights={with_reverse}"],
         "translates de-en; it must translate en-de"),
        (["translate", deen, f"input={source}", f"decode.rerank.reverse_run={runs['ende_other']}", f"decode.rerank.weights={with_reverse}"],
         "its tokenizer differs from run="),
        (["eval", deen, f"out={tmp_path / 'r'}", f"decode.rerank.reverse_run={runs['ende']}", f"decode.rerank.weights={weights}"],
         "weighs the features forward, length_ratio, this decode computes forward, reverse, length_ratio"),
        (["translate", deen, f"input={source}", "engine=ctranslate2", "decode.sampling=epsilon"],
         "CTranslate2 has no epsilon sampling"),
        (["translate", deen, f"input={source}", f"decode.rerank.weights={huge}"],
         f"decode.rerank.weights={huge}: the weight of length_ratio is 1e+308; weights must be within 1000 of 0"),
    ]  # fmt: skip
    for args, expected in cases:
        assert_refused(mtrain(*args, cwd=tmp_path), expected)


def test_a_tagged_source_is_scored_without_its_tag(runs):
    """A multilingual run's sources start with the target language's tag: the reverse model
    scores the source text alone, as for an untagged run."""
    loaded = load_run(runs["deen"], device=CPU)
    tagged = loaded.tokenizer.with_tags([7], [7])  # (any id stands in for a tag here)
    cfg = DecodeConfig(beam=2, nbest=2, **SHORT, rerank=RerankConfig(reverse_run=str(runs["ende"])))
    nbest = as_engine(loaded.model, loaded.tokenizer, CPU).translate_batch(encoded(loaded.tokenizer), cfg)
    scorer = FeatureScorer(cfg, CPU)
    plain = scorer(loaded.tokenizer, encoded(loaded.tokenizer), nbest)
    with_tag = scorer(tagged, encoded(tagged), nbest)
    assert all(np.array_equal(a, b) for a, b in zip(plain, with_tag, strict=True))


def test_translate_writes_mbr_n_best_rows(runs, tmp_path):
    from omegaconf import OmegaConf

    from mtrain.cli.translate import run_translate
    from mtrain.config import TranslateConfig

    source, output = tmp_path / "in.de", tmp_path / "out.tsv"
    source.write_text("".join(s + "\n" for s in SENTENCES), encoding="utf-8")
    cfg = OmegaConf.to_object(
        OmegaConf.merge(
            OmegaConf.structured(TranslateConfig),
            {
                "run": str(runs["deen"]),
                "input": str(source),
                "output": str(output),
                "device": "cpu",
                "precision": "fp32",
                "decode": {**SHORT, "nbest": 2, "mbr": {"candidates": "both", "num_candidates": 4}},
            },
        )
    )
    run_translate(cfg)
    rows = [line.split("\t") for line in output.read_text(encoding="utf-8").splitlines()]
    assert {int(row[0]) for row in rows} == {0, 1, 2} and all(len(row) == 3 for row in rows)
    assert all(sum(int(row[0]) == i for row in rows) <= 2 for i in range(3))
