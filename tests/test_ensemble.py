"""Ensemble decoding (mtrain.decode.engines.ensemble) and its opener (mtrain.export.engine, ensemble=):
the mean of the members' log-probabilities, one KV cache per member, tokenizers checked."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from mtrain.checkpoint.files import save_checkpoint
from mtrain.config import DecodeConfig, Engine, EvalConfig, ModelConfig
from mtrain.decode.engines.ensemble import EnsembleModel
from mtrain.decode.engines.torch_engine import TorchEngine
from mtrain.decode.search.generator import generate
from mtrain.decode.translation.translator import translate_sentences
from mtrain.errors import MtrainError
from mtrain.export import engine as engine_module
from mtrain.export.engine import open_engine
from mtrain.model import build_model
from mtrain.model.positions import position_limit
from mtrain.rundir import RunDir
from tests.conftest import train_spm_tokenizer
from tests.decoding_run import TEST_SENTENCES as SENTENCES
from tests.decoding_run import write_test_run
from tests.tiny_models import exhaustive_best, search_model, source_batch, tiny_model, train_to_copy
from tests.warm_process import run_mtrain

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny models

UNK, PAD, BOS, EOS = 0, 1, 2, 3
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def trained():
    """Two copy-task models of different shapes: 2+2 layers d_model 32 sinusoidal, and
    1+1 layers d_model 48 rope with the vocabulary padded to 16 rows (EOS at varied steps)."""
    torch.set_num_threads(1)
    a = train_to_copy(tiny_model(seed=11), steps=100)
    b = train_to_copy(
        tiny_model(
            seed=12,
            positions="rope",
            encoder_layers=1,
            decoder_layers=1,
            d_model=48,
            vocab_multiple=16,
            max_positions=96,
        ),
        steps=150,
        seed=1,
    )
    return a, b


def outputs(hyps):
    return [[(h.tokens, h.score, h.log_prob) for h in sentence] for sentence in hyps]


CONFIGS = {
    "beam": dict(beam=4, nbest=1, max_len_a=1.0, max_len_b=4),
    "nbest": dict(beam=5, nbest=3, max_len_a=1.0, max_len_b=4, no_repeat_ngram=2),
    "greedy": dict(beam=1, max_len_a=1.0, max_len_b=4),
    "sampling": dict(sampling="topk", top_k=0, nbest=3, seed=5, max_len_a=1.0, max_len_b=4),
}


# ------------------------------------------------------------------ the mean, step by step
@pytest.mark.parametrize("search", list(CONFIGS))
def test_an_ensemble_of_one_is_the_model_exactly(search, trained):
    model = trained[0]
    src, mask = source_batch([5, 9, 3, 12, 7], seed=3)
    cfg = DecodeConfig(**CONFIGS[search])
    alone = generate(model, src, mask, cfg, BOS, EOS, PAD)
    assert outputs(generate(EnsembleModel([model]), src, mask, cfg, BOS, EOS, PAD)) == outputs(alone)
    assert len({len(h.tokens) for sentence in alone for h in sentence}) >= 2  # EOS at varied steps


@pytest.mark.parametrize("search", list(CONFIGS))
def test_an_ensemble_of_a_model_with_itself_ranks_as_the_model(search, trained):
    model = trained[0]
    src, mask = source_batch([5, 9, 3, 12, 7], seed=4)
    cfg = DecodeConfig(**CONFIGS[search])
    alone = generate(model, src, mask, cfg, BOS, EOS, PAD)
    twice = generate(EnsembleModel([model, model]), src, mask, cfg, BOS, EOS, PAD)
    assert [[h.tokens for h in s] for s in twice] == [[h.tokens for h in s] for s in alone]
    # (a + a) / 2 == a exactly; the generator's log-softmax of log-probabilities moves them by rounding only
    assert [h.score for s in twice for h in s] == pytest.approx([h.score for s in alone for h in s], abs=1e-5)


def test_the_first_step_is_the_mean_of_the_members_log_probabilities(trained):
    a, b = trained
    assert a.output_proj.out_features != b.output_proj.out_features  # 40 rows vs 48 (vocab_multiple 16)
    src, mask = source_batch([6, 4, 9], seed=5)
    ensemble = EnsembleModel([a, b])
    bos = torch.full((3,), BOS)
    with torch.inference_mode():
        got = ensemble.decode_step(bos, ensemble.start_decoding(ensemble.encode(src, mask), mask))
        by_hand = []
        for member in (a, b):
            logits = member.decode_step(bos, member.start_decoding(member.encode(src, mask), mask))
            by_hand.append(torch.log_softmax(logits.float(), dim=-1)[:, :40])
    torch.testing.assert_close(got, (by_hand[0] + by_hand[1]) / 2, rtol=0, atol=0)

    # The generator normalises that mean: with max_len 0 the only output is EOS at the first step.
    forced = generate(ensemble, src, mask, DecodeConfig(beam=2, max_len_a=0.0, max_len_b=0), BOS, EOS, PAD)
    expected = torch.log_softmax((by_hand[0] + by_hand[1]) / 2, dim=-1)[:, EOS]
    assert [s[0].tokens for s in forced] == [[], [], []]
    assert [s[0].log_prob for s in forced] == pytest.approx(expected.tolist(), abs=1e-6)


@pytest.mark.parametrize("beam,nbest", [(1, 1), (4, 3)])
def test_the_members_caches_give_what_recomputation_gives(beam, nbest, trained):
    """One DecoderState per member, reordered along the beam and as sentences finish: the same
    tokens and scores as recomputing every member over the whole prefix each step."""
    ensemble = EnsembleModel(list(trained))
    src, mask = source_batch([5, 9, 3, 12, 7, 2], seed=6)
    cfg = DecodeConfig(beam=beam, nbest=nbest, max_len_a=1.0, max_len_b=4)
    cached = generate(ensemble, src, mask, cfg, BOS, EOS, PAD, use_cache=True)
    recomputed = generate(ensemble, src, mask, cfg, BOS, EOS, PAD, use_cache=False)
    assert [[h.tokens for h in s] for s in cached] == [[h.tokens for h in s] for s in recomputed]
    assert [h.score for s in cached for h in s] == pytest.approx([h.score for s in recomputed for h in s], abs=1e-5)
    assert len({len(h.tokens) for s in cached for h in s}) >= 3


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_full_width_beam_over_an_ensemble_equals_exhaustive_search(alpha):
    vocab, max_len = 9, 3  # 155 possible outputs
    first = search_model(vocab, seed=1)
    torch.manual_seed(3)  # another variant: rope, 1 decoder layer, post-norm, another padding of the vocabulary
    second = build_model(
        ModelConfig(
            encoder_layers=1,
            decoder_layers=1,
            d_model=24,
            heads=2,
            ffn_dim=32,
            dropout=0.0,
            vocab_multiple=1,
            positions="rope",
            norm_position="post",
            max_positions=32,
        ),
        vocab,
        vocab,
        PAD,
        joint_vocab=True,
    ).eval()
    with torch.no_grad():
        second.output_proj.weight.mul_(3.0)
    ensemble = EnsembleModel([first, second])
    differs_from_first = []
    for seed in range(2):
        torch.manual_seed(200 + seed)
        src = torch.cat([torch.randint(4, vocab, (1, 4)), torch.tensor([[EOS]])], dim=1)
        best_tokens, best_score, all_scores = exhaustive_best(ensemble, src, max_len, alpha, vocab)
        differs_from_first.append(best_tokens != exhaustive_best(first, src, max_len, alpha, vocab)[0])
        cfg = DecodeConfig(
            beam=len(all_scores),
            nbest=1,
            max_len_a=0.0,
            max_len_b=max_len,
            min_len=1,
            length_penalty=alpha,
            early_stopping=False,
        )
        hyp = generate(ensemble, src, src.eq(PAD), cfg, BOS, EOS, PAD)[0][0]
        assert hyp.tokens == best_tokens
        assert hyp.score == pytest.approx(best_score, abs=1e-5)
    assert any(differs_from_first)  # the second member changes what is best


def test_members_of_other_sizes_and_positions_limit_the_ensemble_to_the_smallest(trained):
    a, b = trained  # max_positions 128 and 96
    none = tiny_model(seed=13, positions="none")
    assert position_limit(EnsembleModel([a, b, none])) == 96
    assert position_limit(EnsembleModel([none])) is None
    src, mask = source_batch([4, 7], seed=7)
    hyps = generate(EnsembleModel([a, b, none]), src, mask, DecodeConfig(beam=3, nbest=2), BOS, EOS, PAD)
    assert all(len(s) == 2 and s[0].score >= s[1].score for s in hyps)


def test_attention_is_the_members_mean_and_needs_equal_depths_for_all(trained):
    a, b = trained
    src, mask = source_batch([6], seed=8)
    ensemble = EnsembleModel([a, b])
    best = generate(ensemble, src, mask, DecodeConfig(beam=3), BOS, EOS, PAD, attention_layer="last")[0][0]
    rows = []
    states = [m.start_decoding(m.encode(src, mask), mask) for m in (a, b)]
    with torch.inference_mode():
        for token in [BOS] + best.tokens:
            weights = [
                m.decode_step(torch.tensor([token]), s, need_attention=True)[1][0]
                for m, s in zip((a, b), states, strict=True)
            ]
            rows.append((weights[0] + weights[1]) / 2)
    torch.testing.assert_close(best.attention, torch.stack(rows), atol=1e-5, rtol=0)
    with pytest.raises(MtrainError, match="attention_layer=all: .*different decoder depths.*attention_layer=last"):
        generate(ensemble, src, mask, DecodeConfig(beam=2), BOS, EOS, PAD, attention_layer="all")


def test_low_precision_engine_casts_every_member_once_and_leaves_them_alone(trained):
    a, b = trained
    sources = [[5, 9, 12, 7, EOS], [8, 8, 30, EOS]]
    cfg = DecodeConfig(beam=3, nbest=2, max_len_a=1.0, max_len_b=3)
    engine = TorchEngine(EnsembleModel([a, b]), PAD, BOS, EOS, "cpu", "bf16")
    assert {m.output_proj.weight.dtype for m in engine.model.members} == {torch.bfloat16}
    assert all(p.dtype == torch.float32 for m in (a, b) for p in m.parameters())
    assert all(len(s) == 2 for s in engine.translate_batch(sources, cfg))
    one = TorchEngine(EnsembleModel([a]), PAD, BOS, EOS, "cpu", "bf16").translate_batch(sources, cfg)
    assert outputs(one) == outputs(TorchEngine(a, PAD, BOS, EOS, "cpu", "bf16").translate_batch(sources, cfg))


# ------------------------------------------------------------------ run directories and checkpoint files
@pytest.fixture(scope="module")
def runs(tmp_path_factory, data_dir):
    """Runs a and b (one tokenizer; b a rope model with 1 decoder layer), and c (another tokenizer)."""
    root = tmp_path_factory.mktemp("ensemble_runs")
    shared = train_spm_tokenizer(root / "spm_shared", data_dir, 0)
    other = train_spm_tokenizer(root / "spm_other", data_dir, 5000)
    assert shared.fingerprint != other.fingerprint
    return {
        "a": write_test_run(root / "a", shared, seed=0, update=7),
        "b": write_test_run(root / "b", shared, seed=1, update=9, positions="rope", decoder_layers=1),
        "c": write_test_run(root / "c", other, seed=2, update=5),
    }


DECODE = DecodeConfig(beam=2, max_len_a=0.5, max_len_b=3)


def test_open_engine_decodes_run_and_members_together(runs, tmp_path):
    a, b = runs["a"], runs["b"]
    loose = tmp_path / "copied.pt"  # a checkpoint outside any run: run='s tokenizer, by its recorded fingerprint
    loose.write_bytes((b / "checkpoints" / "best.pt").read_bytes())
    opened = open_engine(
        a, Engine.torch, CPU, "fp32", ensemble=[str(b), str(a / "checkpoints" / "best.pt"), str(loose)]
    )
    assert isinstance(opened.model, EnsembleModel) and len(opened.model.members) == 4
    assert [m.checkpoint_path for m in opened.members] == [
        a / "checkpoints" / "best.pt",
        b / "checkpoints" / "best.pt",
        a / "checkpoints" / "best.pt",
        loose,
    ]
    assert opened.loaded is opened.members[0] and opened.precision == "fp32"
    assert opened.description.startswith("an ensemble of 4: ")
    for member in opened.members:
        assert f"{member.checkpoint_path} (update {member.update})" in opened.description
    single = open_engine(a, Engine.torch, CPU, "fp32")
    assert not isinstance(single.model, EnsembleModel) and len(single.members) == 1  # run= alone: one model

    by_hand = EnsembleModel([m.model for m in opened.members])
    expected = translate_sentences(by_hand, opened.tokenizer, SENTENCES, DECODE, "cpu")
    got = translate_sentences(opened.model, opened.tokenizer, SENTENCES, DECODE, "cpu")
    assert [[h.text for h in s] for s in got] == [[h.text for h in s] for s in expected]


def test_a_member_with_another_tokenizer_is_refused_before_any_model_loads(runs, tmp_path, monkeypatch):
    a, c = runs["a"], runs["c"]
    monkeypatch.setattr(engine_module, "load_run", lambda *args, **kwargs: pytest.fail("a model was loaded"))
    for member in (c, c / "checkpoints" / "best.pt"):
        with pytest.raises(MtrainError) as refused:
            open_engine(a, Engine.torch, CPU, "fp32", ensemble=[str(runs["b"]), str(member)])
        message = str(refused.value)
        assert "\n" not in message and str(c / "tokenizer") in message and str(a / "tokenizer") in message
    loose = tmp_path / "other.pt"
    loose.write_bytes((c / "checkpoints" / "best.pt").read_bytes())
    with pytest.raises(MtrainError, match=rf"ensemble: {loose} was trained with another tokenizer than run={a}'s"):
        open_engine(a, Engine.torch, CPU, "fp32", ensemble=[str(loose)])
    unrecorded = tmp_path / "unrecorded.pt"
    save_checkpoint(unrecorded, {"model": {}, "config": {"model": {}}})
    with pytest.raises(MtrainError, match=rf"ensemble: {unrecorded}: is not in a run's checkpoints/ and records no"):
        open_engine(a, Engine.torch, CPU, "fp32", ensemble=[str(unrecorded)])
    with pytest.raises(
        MtrainError, match=rf"^ensemble: '{tmp_path / 'nope'}': no such run directory or checkpoint file$"
    ):
        open_engine(a, Engine.torch, CPU, "fp32", ensemble=[str(tmp_path / "nope")])
    with pytest.raises(MtrainError, match="^ensemble: engine=ctranslate2 decodes one model"):
        open_engine(a, Engine.ctranslate2, CPU, "fp32", ensemble=[str(runs["b"])])


def test_eval_of_an_ensemble_reports_its_members(runs, tmp_path):
    from mtrain.cli.evaluate import evaluate_run

    a, b = runs["a"], runs["b"]
    cfg = OmegaConf.to_object(
        OmegaConf.merge(
            OmegaConf.structured(EvalConfig),
            {
                "run": str(a),
                "ensemble": [str(b)],
                "out": str(tmp_path / "report"),
                "device": "cpu",
                "precision": "fp32",
                "metrics": ["bleu"],
                "decode": {"beam": 2, "max_len_a": 0.5, "max_len_b": 3},
            },
        )
    )
    lines = []
    report = evaluate_run(cfg, log=lines.append)
    members = [
        {"path": str(a / "checkpoints" / "best.pt"), "update": 7},
        {"path": str(b / "checkpoints" / "best.pt"), "update": 9},
    ]
    assert report["checkpoint"]["ensemble"] == members
    assert json.loads((tmp_path / "report" / "test.json").read_text())["checkpoint"]["ensemble"] == members
    markdown = (tmp_path / "report" / "test.md").read_text()
    assert f"- **Ensemble** of 2 (mean of their log-probabilities): `{members[0]['path']}` (update 7), " in markdown
    assert any(line.startswith("decoding 3 sentences of test with an ensemble of 2: ") for line in lines)
    assert not RunDir(a).eval_dir.exists()  # run='s own report is untouched


def test_eval_average_last_with_an_ensemble_averages_run_s_checkpoints_only(runs, tmp_path):
    """average_last=N averages run='s last N update_N.pt into out=DIR; that average is run='s
    member of the ensemble, and the other members decode as given."""
    import shutil

    from mtrain.checkpoint.files import load_checkpoint
    from mtrain.cli.evaluate import evaluate_run

    a = tmp_path / "a"
    shutil.copytree(runs["a"], a)
    run = RunDir(a)
    best = load_checkpoint(run.checkpoint("best"))
    OmegaConf.save(OmegaConf.create(best["config"]), run.config_file)
    for update in (3, 7):
        save_checkpoint(run.checkpoint(f"update_{update}"), {**best, "update": update})
    cfg = OmegaConf.to_object(
        OmegaConf.merge(
            OmegaConf.structured(EvalConfig),
            {
                "run": str(a),
                "ensemble": [str(runs["b"])],
                "out": str(tmp_path / "report"),
                "average_last": 2,
                "device": "cpu",
                "precision": "fp32",
                "metrics": ["bleu"],
                "decode": {"beam": 1, "max_len_b": 2},
            },
        )
    )
    report = evaluate_run(cfg, log=lambda line: None)
    average = tmp_path / "report" / "average_last2.pt"
    assert report["checkpoint"]["averaged_from"] == [str(run.checkpoint("update_3")), str(run.checkpoint("update_7"))]
    assert [m["path"] for m in report["checkpoint"]["ensemble"]] == [
        str(average),
        str(runs["b"] / "checkpoints" / "best.pt"),
    ]


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            {"engine": "ctranslate2"},
            "ensemble: engine=ctranslate2 decodes one model; decode an ensemble with engine=torch",
        ),
        ({"out": None}, "ensemble: the report of an ensemble is not run=R's own; give out=DIR to write it"),
        (
            {"run": None, "hyp": "h.txt", "out": None},
            "ensemble: decodes with run=RUN's model; hyp= and runs= decode nothing",
        ),
    ],
)
def test_the_config_checks_refuse_an_ensemble_where_it_cannot_decode_or_report(overrides, message, tmp_path):
    from mtrain.config import TranslateConfig
    from mtrain.config_checks import check_config

    cfg = OmegaConf.merge(
        OmegaConf.structured(EvalConfig), {"run": "R", "ensemble": ["B"], "out": str(tmp_path), **overrides}
    )
    with pytest.raises(MtrainError, match=f"^{message}"):
        check_config(cfg)
    if "engine" in overrides:
        with pytest.raises(MtrainError, match=f"^{message}$"):
            check_config(
                OmegaConf.merge(OmegaConf.structured(TranslateConfig), {"run": "R", "ensemble": ["B"], **overrides})
            )


# ------------------------------------------------------------------ the commands
def mtrain(*args: str, cwd: Path, stdin: bytes = b"") -> subprocess.CompletedProcess:
    return run_mtrain(*args, input=stdin, cwd=cwd, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=120)


@pytest.mark.slow
def test_translate_command_with_an_ensemble(runs, tmp_path):
    a, b = runs["a"], runs["b"]
    source = tmp_path / "in.de"
    source.write_text("".join(s + "\n" for s in SENTENCES), encoding="utf-8")
    # `ensemble=B,FILE` as users type it (the command makes it the list [B,FILE]).
    result = mtrain(
        "translate",
        f"run={a}",
        f"ensemble={b},{a / 'checkpoints' / 'best.pt'}",
        f"input={source}",
        f"output={tmp_path / 'out.en'}",
        "decode.beam=2",
        "decode.max_len_a=0.5",
        "decode.max_len_b=3",
        "num_threads=1",
        "precision=fp32",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr.decode()
    opened = open_engine(a, Engine.torch, CPU, "fp32", ensemble=[str(b), str(a)])
    expected = translate_sentences(opened.model, opened.tokenizer, SENTENCES, DECODE, "cpu")
    assert (tmp_path / "out.en").read_text(encoding="utf-8").splitlines() == [s[0].text for s in expected]
    # output= gets its provenance record: every member's checkpoint with its sha256, the decode settings
    record = json.loads((tmp_path / "out.en.mtrain.json").read_text(encoding="utf-8"))
    assert [item["path"] for item in record["checkpoints"]] == [
        str(a / "checkpoints" / "best.pt"),
        str(b / "checkpoints" / "best.pt"),
        str(a / "checkpoints" / "best.pt"),
    ]
    assert record["decode"]["beam"] == 2 and record["input"] == str(source) and len(record["input_sha256"]) == 64
    log = result.stderr.decode()
    assert "translating with an ensemble of 3: " in log and f"{b / 'checkpoints' / 'best.pt'} (update 9)" in log

    refused = mtrain("translate", f"run={a}", f"ensemble=[{runs['c']}]", f"input={source}", cwd=tmp_path)
    errors = [line for line in refused.stderr.decode().splitlines() if not line.startswith("mtrain: INFO")]
    assert refused.returncode == 2 and len(errors) == 1
    assert errors[0].startswith(f"mtrain: error: ensemble: {runs['c'] / 'tokenizer'} differs from run={a}'s tokenizer")
