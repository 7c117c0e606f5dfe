"""mtrain.export and engine=ctranslate2: the converted model computes and translates as mtrain does."""

from __future__ import annotations

import itertools
import json
import os
import random
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

ctranslate2 = pytest.importorskip(
    "ctranslate2", reason="ctranslate2 is not installed: the CTranslate2 export is optional (pip install 'mtrain[ct2]')"
)

from mtrain.config import DecodeConfig, FitConfig, ModelConfig, to_plain
from mtrain.decode.engines.ct2_engine import load_ctranslate2
from mtrain.decode.translation.translator import translate_encoded, translate_sentences
from mtrain.decoding_rules import CONSTRAINTS_WITH_CTRANSLATE2, RefusedCombination
from mtrain.errors import MtrainError
from mtrain.export import check_exportable, export_ctranslate2, export_run
from mtrain.model import build_model
from tests.warm_process import run_mtrain
from tests.word_lists import DE_EN_WORDS

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny models

WORDS = DE_EN_WORDS
MODEL = dict(encoder_layers=2, decoder_layers=2, d_model=64, heads=4, ffn_dim=128, dropout=0.0, max_positions=64)
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Sentences of random words in the `{split}.{lang}` layout (the same text on both sides)."""
    root = tmp_path_factory.mktemp("corpus")
    rng = random.Random(3)
    for split, count in (("train", 300), ("val", 8), ("test", 12)):
        lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 7))) for _ in range(count)]
        for lang in ("de", "en"):
            (root / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def fit_config(corpus, tmp_path_factory):
    cfg = OmegaConf.structured(FitConfig(model=ModelConfig(**MODEL)))
    cfg.data.local_dir = str(corpus)
    cfg.data.cache_dir = str(tmp_path_factory.mktemp("cache"))
    cfg.data.splits.test = "test"
    cfg.tokenizer.vocab_size = 56
    return cfg


@pytest.fixture(scope="module")
def tokenizer(fit_config):
    from mtrain.tokenizer import train_or_load_tokenizer

    return train_or_load_tokenizer(fit_config.tokenizer, fit_config.data, log=lambda *_: None)


def copy_batch(generator: torch.Generator, vocab: int, n: int = 64):
    """Source `y eos` and teacher-forcing pairs `[bos] y` -> `y eos` for random sequences y."""
    pad, bos, eos = 1, 2, 3
    lengths = torch.randint(2, 12, (n,), generator=generator)
    longest = int(lengths.max())
    tokens = torch.randint(4, vocab, (n, longest), generator=generator)
    inside = torch.arange(longest + 1)[None] < lengths[:, None]
    y = torch.cat([tokens, torch.full((n, 1), pad)], 1).masked_fill(~inside, pad)
    src = y.clone()
    src[torch.arange(n), lengths] = eos
    tgt_input = torch.cat([torch.full((n, 1), bos), y[:, :-1]], 1)
    return src, src.eq(pad), tgt_input, src


@pytest.fixture(scope="module")
def model(tokenizer):
    """A tiny model trained to copy its input (a few seconds): confident, so its searches
    have clear winners and both engines must agree token for token."""
    torch.set_num_threads(1)  # module fixtures run before the per-test thread setting
    torch.manual_seed(0)
    model = build_model(
        ModelConfig(**MODEL),
        tokenizer.src_vocab_size,
        tokenizer.tgt_vocab_size,
        tokenizer.pad_id,
        joint_vocab=tokenizer.joint,
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    generator = torch.Generator().manual_seed(0)
    for _ in range(200):
        src, mask, tgt_input, tgt_output = copy_batch(generator, tokenizer.tgt_vocab_size)
        logits = model(src, mask, tgt_input)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt_output.flatten(), ignore_index=1)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 1.0, "the copy model did not learn; the comparisons below would be meaningless"
    return model.eval()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, fit_config, tokenizer, model) -> Path:
    """A run directory as `mtrain fit` leaves it: tokenizer/, config.yaml, checkpoints/best.pt."""
    from mtrain.checkpoint.files import save_checkpoint

    run = tmp_path_factory.mktemp("run")
    tokenizer.save(run / "tokenizer")
    (run / "config.yaml").write_text(OmegaConf.to_yaml(fit_config), encoding="utf-8")
    save_checkpoint(
        run / "checkpoints" / "best.pt", {"model": model.state_dict(), "config": to_plain(fit_config), "update": 200}
    )
    return run


@pytest.fixture(scope="module")
def exported(run_dir, tmp_path_factory) -> Path:
    return export_run(run_dir, tmp_path_factory.mktemp("export") / "ct2")


@pytest.fixture(scope="module")
def sources(tokenizer, corpus) -> list:
    """Held-out random sequences and the corpus' test sentences, as encoded sources (ids + eos)."""
    generator = torch.Generator().manual_seed(99)
    src, mask, _, _ = copy_batch(generator, tokenizer.src_vocab_size, n=10)
    copies = [row[~row_mask].tolist() for row, row_mask in zip(src, mask, strict=True)]
    sentences = (corpus / "test.de").read_text(encoding="utf-8").splitlines()
    return copies + [tokenizer.encode_src(s) + [tokenizer.eos_id] for s in sentences] + [None]


# ------------------------------------------------------------------ translations
@pytest.mark.parametrize(
    "settings",
    [
        dict(beam=1),
        dict(beam=4),
        dict(beam=4, nbest=3, length_penalty=0.6),
        dict(beam=3, length_penalty=0.0),
    ],
    ids=["greedy", "beam4", "nbest3-alpha0.6", "alpha0"],
)
def test_exported_model_translates_like_mtrain(exported, model, tokenizer, sources, settings):
    cfg = DecodeConfig(**settings)
    engine = load_ctranslate2(exported, CPU, num_threads=1)
    expected = translate_encoded(model, tokenizer, sources, cfg, CPU)
    got = translate_encoded(engine, tokenizer, sources, cfg, CPU)
    assert len(got) == len(expected)
    for want, have in zip(expected, got, strict=True):
        assert_same_nbest(have, want, cfg.length_penalty)


def score_tolerance(hyp, alpha: float) -> float:
    """How far the two engines' scores of one hypothesis may lie apart.

    CTranslate2 bans pad/bos before its softmax, mtrain after: log-probs differ by that mass
    at each step (up to ~1e-3 for this tiny model; ~1e-5 for a trained translation model),
    on a score divided by `length**alpha` like the log-prob it comes from.
    """
    length = len(hyp.tokens) + 1  # with EOS
    return 3e-3 * length / length**alpha


def assert_same_nbest(have: list, want: list, alpha: float) -> None:
    """CTranslate2's n-best list `have` is mtrain's `want` wherever floating point decides it.

    Two engines' kernels (CTranslate2 picks other ones on AMX than on AVX2 or AVX-512) round
    differently, so hypotheses whose scores are tied within `score_tolerance` may swap places,
    or one may fall off the end of one list and not the other. Decided, and asserted: the
    scores rank by rank; the same score, log-prob and text for a hypothesis both lists hold;
    the same hypothesis at each rank unless the two there are tied (a swap) or one of them is
    missing from the other list and ties its last score (a cut-off).
    """
    assert len(have) == len(want)
    for h, w in zip(have, want, strict=True):
        assert h.score == pytest.approx(w.score, abs=max(score_tolerance(h, alpha), score_tolerance(w, alpha)))
    for h, w in ((h, w) for h in have for w in want if h.tokens == w.tokens):
        assert h.text == w.text
        assert h.score == pytest.approx(w.score, abs=score_tolerance(w, alpha))
        assert h.log_prob == pytest.approx(w.log_prob, abs=3e-3 * (len(w.tokens) + 1))
    for h, w in zip(have, want, strict=True):
        if h.tokens != w.tokens:
            assert_tied(h, w, want, alpha)  # CTranslate2's hypothesis among mtrain's
            assert_tied(w, h, have, alpha)  # and mtrain's among CTranslate2's


def assert_tied(hyp, displaced, others: list, alpha: float) -> None:
    """`hyp` took `displaced`'s rank in the other engine's list `others`: there, `hyp` scores
    within the two engines' disagreement of `displaced`, or `hyp` is missing and its score
    ties the last one (two tolerances: each engine may be off by one)."""
    same = [other for other in others if other.tokens == hyp.tokens]
    anchor, mate = (same[0], displaced) if same else (hyp, others[-1])
    gap = abs(anchor.score - mate.score)
    assert gap <= score_tolerance(anchor, alpha) + score_tolerance(mate, alpha), (
        f"{hyp.tokens} ranks where {displaced.tokens} does in the other engine, but their scores are "
        f"{gap:.2e} apart: not a near-tie"
    )


def test_attention_of_the_last_layer_matches(exported, model, tokenizer, sources):
    engine = load_ctranslate2(exported, CPU, num_threads=1)
    cfg = DecodeConfig(beam=4)
    expected = translate_encoded(model, tokenizer, sources, cfg, CPU, attention_layer="last")
    got = translate_encoded(engine, tokenizer, sources, cfg, CPU, attention_layer="last")
    for ids, want, have in zip(sources, expected, got, strict=True):
        if ids is not None:  # (output tokens + EOS, src_len), averaged over heads
            assert torch.allclose(have[0].attention, want[0].attention, atol=1e-4)


def test_no_repeat_ngram_holds_in_ctranslate2(exported, tokenizer, sources):
    engine = load_ctranslate2(exported, CPU, num_threads=1)
    for hyps in translate_encoded(engine, tokenizer, sources, DecodeConfig(beam=3, no_repeat_ngram=2), CPU):
        bigrams = list(itertools.pairwise(hyps[0].tokens))
        assert len(bigrams) == len(set(bigrams))


def test_length_limits_follow_mtrain(exported, model, tokenizer, sources):
    engine = load_ctranslate2(exported, CPU, num_threads=1)
    # The limit cuts the copies: greedy keeps the first max_len tokens, as mtrain's forced EOS does.
    short = DecodeConfig(beam=1, max_len_a=0.0, max_len_b=3)
    assert [h[0].tokens for h in translate_encoded(engine, tokenizer, sources, short, CPU)] == [
        h[0].tokens for h in translate_encoded(model, tokenizer, sources, short, CPU)
    ]
    # Per sentence: a * src_len + b, with src_len counting the eos.
    scaled = DecodeConfig(beam=4, max_len_a=0.5, max_len_b=0)
    for ids, hyps in zip(sources, translate_encoded(engine, tokenizer, sources, scaled, CPU), strict=True):
        assert len(hyps[0].tokens) <= (int(0.5 * len(ids)) if ids else 0)
    at_least = DecodeConfig(beam=4, min_len=14, max_len_b=20)
    for ids, hyps in zip(sources, translate_encoded(engine, tokenizer, sources, at_least, CPU), strict=True):
        assert ids is None or len(hyps[0].tokens) >= 14


# ------------------------------------------------------------------ the converter, switch by switch
VARIANTS = {
    "default": {},
    "gelu": dict(activation="gelu"),
    "swiglu": dict(activation="swiglu"),
    "learned": dict(positions="learned"),
    "no-positions": dict(positions="none"),
    "rope": dict(positions="rope"),
    "rmsnorm": dict(norm_type="rmsnorm"),
    "post-norm": dict(norm_position="post"),
    "post-norm-final": dict(norm_position="post", final_norm=True),
    "no-final-norm": dict(final_norm=False),
    "shared-norm": dict(shared_norm=True),
    "unscaled": dict(scale_embeddings=False),
    "untied": dict(tie_embeddings=False),
    "identity-qk": dict(cross_q_proj=False, cross_k_proj=False),
    "identity-v": dict(cross_v_proj=False),
    "padded-vocab": dict(vocab_multiple=48),
}


@pytest.mark.parametrize("variant", VARIANTS.values(), ids=VARIANTS.keys())
def test_every_supported_switch_gives_the_same_log_probs(variant, tokenizer, tmp_path):
    """CTranslate2's scores of target sentences equal mtrain's log-softmax, token by token."""
    cfg = ModelConfig(**{**MODEL, **variant})
    torch.manual_seed(1)
    model = build_model(
        cfg, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, tokenizer.pad_id, joint_vocab=tokenizer.joint
    ).eval()
    with torch.no_grad():  # norms and biases away from their initial 1 and 0
        for name, parameter in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                parameter.add_(0.2 * torch.randn_like(parameter))
    directory = export_ctranslate2(model.state_dict(), cfg, tokenizer, tmp_path / "ct2")
    translator = ctranslate2.Translator(str(directory), intra_threads=1)
    pairs = [("ein mann spielt ball", "a man plays ball"), ("zwei hunde", "two dogs in the park on a ball")]
    for source, target in pairs:
        assert_same_scores(translator, model, tokenizer, source, target)


def assert_same_scores(translator, model, tokenizer, source: str, target: str) -> None:
    """CTranslate2's log-probabilities of `target`'s tokens (and eos) given `source` equal mtrain's."""
    src = tokenizer.encode_src(source) + [tokenizer.eos_id]
    tgt = tokenizer.encode_tgt(target)
    scored = translator.score_batch([tokenizer.src_pieces(src)], [tokenizer.tgt_pieces(tgt)])[0]
    src_tokens = torch.tensor([src])
    with torch.no_grad():
        logits = model(src_tokens, src_tokens.eq(tokenizer.pad_id), torch.tensor([[tokenizer.bos_id] + tgt]))
    labels = torch.tensor(tgt + [tokenizer.eos_id])
    expected = torch.log_softmax(logits[0].float(), dim=-1)[torch.arange(len(labels)), labels]
    assert scored.log_probs == pytest.approx(expected.tolist(), abs=1e-4)


def test_export_directory_holds_the_real_vocabulary_and_tokenizer(exported, tokenizer):
    pieces = tokenizer.tgt_pieces(range(tokenizer.tgt_vocab_size))
    assert json.loads((exported / "shared_vocabulary.json").read_text(encoding="utf-8")) == pieces
    config = json.loads((exported / "config.json").read_text(encoding="utf-8"))
    assert (config["bos_token"], config["eos_token"], config["unk_token"]) == ("<s>", "</s>", "<unk>")
    assert config["decoder_start_token"] == "<s>"
    assert (exported / "spm.model").read_bytes() == tokenizer.files["spm.model"].read_bytes()
    metadata = json.loads((exported / "mtrain_export.json").read_text(encoding="utf-8"))
    assert metadata["update"] == 200 and metadata["max_positions"] == MODEL["max_positions"]
    assert metadata["special_ids"] == {"unk": 0, "pad": 1, "bos": 2, "eos": 3}


def test_padded_vocabulary_rows_are_cut(tokenizer, tmp_path):
    cfg = ModelConfig(**{**MODEL, "vocab_multiple": 48})
    model = build_model(
        cfg, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, tokenizer.pad_id, joint_vocab=tokenizer.joint
    )
    assert model.output_proj.weight.shape[0] > tokenizer.tgt_vocab_size
    directory = export_ctranslate2(model.state_dict(), cfg, tokenizer, tmp_path / "ct2")
    assert (
        len(json.loads((directory / "shared_vocabulary.json").read_text(encoding="utf-8"))) == tokenizer.tgt_vocab_size
    )


# ------------------------------------------------------------------ refusals
@pytest.mark.parametrize("order", ["cross_self_ffn", "self_ffn_cross"])
def test_unsupported_decoder_order_is_refused_naming_it(order, tokenizer, tmp_path):
    cfg = ModelConfig(**{**MODEL, "decoder_order": order})
    model = build_model(
        cfg, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, tokenizer.pad_id, joint_vocab=tokenizer.joint
    )
    with pytest.raises(MtrainError, match=f"model.decoder_order={order}: CTranslate2's decoder layer"):
        export_ctranslate2(model.state_dict(), cfg, tokenizer, tmp_path / "ct2")
    assert not (tmp_path / "ct2").exists()


def test_a_setting_the_converter_does_not_know_is_refused():
    cfg = OmegaConf.create({**to_plain(OmegaConf.structured(ModelConfig)), "sandwich_norm": True})
    with pytest.raises(MtrainError, match="model.sandwich_norm=True: the CTranslate2 converter does not know"):
        check_exportable(cfg)


def test_decode_settings_without_a_ctranslate2_counterpart_are_refused(exported, tokenizer, sources):
    engine = load_ctranslate2(exported, CPU, num_threads=1)
    with pytest.raises(MtrainError, match="decode.early_stopping=false"):
        translate_encoded(engine, tokenizer, sources, DecodeConfig(early_stopping=False), CPU)
    with pytest.raises(MtrainError, match="attention_layer=all"):
        translate_encoded(engine, tokenizer, sources, DecodeConfig(), CPU, attention_layer="all")


def test_missing_ctranslate2_is_a_clear_error(monkeypatch, run_dir, tmp_path):
    import sys

    monkeypatch.setitem(sys.modules, "ctranslate2", None)
    with pytest.raises(MtrainError, match=r"ctranslate2 is not installed .*pip install 'mtrain\[ct2\]'"):
        export_run(run_dir, tmp_path / "ct2")


# ------------------------------------------------------------------ the commands
def compose(app: str, overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from mtrain.cli.common import CONFIG_DIR

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return hydra_compose(app, overrides=overrides)


def test_export_and_translate_commands(run_dir, model, tokenizer, corpus, tmp_path):
    from hydra.errors import ConfigCompositionException

    from mtrain.cli.export import run_export
    from mtrain.cli.translate import run_translate

    out = tmp_path / "model_ct2"
    run_export(compose("export", [f"run={run_dir}", "format=ctranslate2", f"out={out}"]))
    with pytest.raises(MtrainError, match="already exists; choose another directory or pass force=true"):
        run_export(compose("export", [f"run={run_dir}", f"out={out}"]))
    with pytest.raises(ConfigCompositionException, match="format=onnx"):  # a choice: refused when composed
        compose("export", [f"run={run_dir}", "format=onnx", f"out={tmp_path / 'x'}"])
    run_export(compose("export", [f"run={run_dir}", f"out={tmp_path / 'int8'}", "quantization=int8"]))

    source = corpus / "test.de"
    sentences = source.read_text(encoding="utf-8").splitlines()
    expected = [h[0].text for h in translate_sentences(model, tokenizer, sentences, DecodeConfig(beam=4), CPU)]
    for run, extra in ((out, []), (run_dir, []), (tmp_path / "int8", []), (run_dir, ["precision=int8"])):
        output = tmp_path / "out.en"
        run_translate(
            compose(
                "translate",
                [
                    f"run={run}",
                    "engine=ctranslate2",
                    f"input={source}",
                    f"output={output}",
                    "decode.beam=4",
                    "num_threads=1",
                    *extra,
                ],
            )
        )
        lines = output.read_text(encoding="utf-8").splitlines()
        if "int8" in str(run) or extra:
            assert len(lines) == len(expected)  # quantized: close, not necessarily identical
        else:
            assert lines == expected


def test_eval_with_ctranslate2_reports_the_same_translations(run_dir):
    from mtrain.cli.evaluate import evaluate_run

    reports = {
        engine: evaluate_run(
            compose(
                "eval",
                [f"run={run_dir}", "split=test", f"engine={engine}", "decode.beam=4", "num_threads=1", "device=cpu"],
            ),
            log=lambda *_: None,
        )
        for engine in ("torch", "ctranslate2")
    }
    assert reports["ctranslate2"]["decode"]["engine"] == "ctranslate2"
    assert reports["ctranslate2"]["decode"]["precision"] == "float32"
    assert reports["ctranslate2"]["metrics"]["bleu"]["score"] == reports["torch"]["metrics"]["bleu"]["score"]


def test_an_export_directory_as_run_is_decoded_by_ctranslate2_and_says_so(
    exported, model, tokenizer, corpus, tmp_path, monkeypatch, capsys
):
    """translate and eval given run=EXPORT_DIR (no engine=) decode it with CTranslate2, and say
    so; eval reads the split its run was tested on and records the exported checkpoint."""
    import sys

    from mtrain.cli import main as cli
    from mtrain.cli.common import check_before_run

    def mtrain(*argv: str) -> None:
        monkeypatch.setattr(sys, "argv", ["mtrain", *argv])
        cli.main()

    source = corpus / "test.de"
    sentences = source.read_text(encoding="utf-8").splitlines()
    expected = [h[0].text for h in translate_sentences(model, tokenizer, sentences, DecodeConfig(beam=4), CPU)]
    output = tmp_path / "out.en"
    quick = ["decode.beam=4", "num_threads=1", "device=cpu"]
    mtrain("translate", f"run={exported}", f"input={source}", f"output={output}", *quick)
    logged = capsys.readouterr().err  # translate logs to stderr
    assert f"run={exported} is a CTranslate2 model written by `mtrain export`: decoding it with engine=ctranslate2" in (
        logged
    )
    assert output.read_text(encoding="utf-8").splitlines() == expected
    check_before_run("translate", [f"run={exported}", "precision=int8"])  # CTranslate2's compute types pass

    reports = tmp_path / "reports"
    mtrain("eval", f"run={exported}", "split=test", f"out={reports}", "metrics=[bleu]", *quick)
    printed = capsys.readouterr().out
    assert "decoding it with engine=ctranslate2" in printed
    report = json.loads((reports / "test.json").read_text(encoding="utf-8"))
    assert report["decode"]["engine"] == "ctranslate2" and report["sentences"] == len(sentences)
    assert (reports / "test.hyp").read_text(encoding="utf-8").splitlines() == expected
    assert report["checkpoint"]["export"] == str(exported.resolve()) and report["checkpoint"]["update"] == 200
    assert report["checkpoint"]["path"].endswith("best.pt")
    for refused, key in ((["average_last=2"], "average_last=2"), (["checkpoint=last"], "checkpoint=last")):
        with pytest.raises(SystemExit) as stop:
            mtrain("eval", f"run={exported}", "split=test", f"out={reports}", *refused, *quick)
        assert stop.value.code == 2
        assert capsys.readouterr().err.startswith(f"mtrain: error: {key}: ")


def test_a_restricted_output_vocabulary_exports_as_a_bias_and_scores_the_same(tokenizer, tmp_path):
    """model.output_vocab=target: CTranslate2 gives the pieces outside the restriction
    probability 0 as mtrain does, and the same log-probabilities to the others."""
    cfg = ModelConfig(**{**MODEL, "output_vocab": "target"})
    torch.manual_seed(1)
    model = build_model(
        cfg, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, tokenizer.pad_id, joint_vocab=tokenizer.joint
    ).eval()
    target = "two dogs in the park on a ball"
    tgt = tokenizer.encode_tgt(target)
    allowed = sorted({*tgt, tokenizer.eos_id, tokenizer.unk_id, *range(20, 40)})
    model.restrict_output(allowed)
    directory = export_ctranslate2(model.state_dict(), cfg, tokenizer, tmp_path / "ct2")
    translator = ctranslate2.Translator(str(directory), intra_threads=1)
    assert_same_scores(translator, model, tokenizer, "zwei hunde", target)
    src = tokenizer.encode_src("zwei hunde") + [tokenizer.eos_id]
    translated = translator.translate_batch([tokenizer.src_pieces(src)], beam_size=4, max_decoding_length=20)
    piece_ids = {piece: index for index, piece in enumerate(tokenizer.tgt_pieces(range(tokenizer.tgt_vocab_size)))}
    produced = {piece_ids[piece] for piece in translated[0].hypotheses[0]}
    assert produced and produced <= set(allowed)


# ------------------------------------------------------------------ format=argos
# Run in a child process: argostranslate reads its folders from the environment when imported.
# Every connection attempt fails there, so a download at install or translate time fails the test.
ARGOS = r"""
import json, socket, sys

def refuse(*args, **kwargs):
    raise OSError("no network: argostranslate tried to connect")

socket.socket.connect = refuse
socket.create_connection = refuse
import argostranslate.package
import argostranslate.translate

argostranslate.package.install_from_path(sys.argv[1])
(package,) = argostranslate.package.get_installed_packages()
text = open(sys.argv[2], encoding="utf-8").read().rstrip("\n")
print(json.dumps({
    "translation": argostranslate.translate.translate(text, "de", "en"),
    "package": [package.from_code, package.from_name, package.to_code, package.to_name, package.package_version],
}))
"""


def test_argos_package_installs_and_translates_offline_like_mtrain_s_ctranslate2(
    run_dir, exported, corpus, tmp_path, capsys
):
    from tests.conftest import needed_in_ci

    needed_in_ci("argostranslate", "pip install --no-deps argostranslate stanza minisbd (.ci/run)")
    from mtrain.cli.export import run_export
    from mtrain.evaluate.metrics import score_corpus

    run = tmp_path / "run"  # with the copy of its test split that `mtrain fit` keeps
    shutil.copytree(run_dir, run)
    (run / "data").mkdir()
    shutil.copyfile(corpus / "test.de", run / "data" / "test.src")
    shutil.copyfile(corpus / "test.en", run / "data" / "test.ref")
    package = tmp_path / "de_en.argosmodel"
    run_export(compose("export", [f"run={run}", "format=argos", f"out={package}"]))
    printed = capsys.readouterr().out
    with zipfile.ZipFile(package) as archive:
        names = set(archive.namelist())
        metadata = json.loads(archive.read("translate-de_en/metadata.json"))
    assert {"translate-de_en/sentencepiece.model", "translate-de_en/minisbd/keep_lines_whole.onnx"} <= names
    assert "translate-de_en/model/model.bin" in names and "translate-de_en/model/mtrain_export.json" not in names
    assert metadata["mtrain"]["run"] == "run" and metadata["mtrain"]["checkpoint"] == "checkpoints/best.pt"
    assert metadata["mtrain"]["update"] == 200

    # Argos decodes with beam 4 and length penalty 0.2, and CTranslate2's compute type `auto`
    # (int8 on a CPU with int8 kernels, whatever the weights: issue 58 item 8, the packages'
    # translations differed from mtrain's float32 ones); mtrain's limit never binds on these lines.
    lines = (corpus / "test.de").read_text(encoding="utf-8").splitlines()
    engine = load_ctranslate2(exported, CPU, num_threads=1, ct2_compute_type="auto")
    settings = DecodeConfig(beam=4, length_penalty=0.2, max_len_a=0.0, max_len_b=63)
    expected = [hyps[0].text for hyps in translate_sentences(engine, engine.tokenizer, lines, settings, CPU)]
    references = (corpus / "test.en").read_text(encoding="utf-8").splitlines()
    bleu = score_corpus(expected, [references], ["bleu"])["bleu"]["score"]
    assert (
        f"score: BLEU {bleu:.2f} on the run's test split (12 lines) with the package's decoding "
        f"(beam 4, length penalty 0.2, {engine.translator.compute_type} compute as CTranslate2's auto picks "
        "on this CPU, as Argos decodes)"
    ) in printed

    folders = {name: tmp_path / name for name in ("home", "data", "config", "cache", "packages")}
    env = {
        **os.environ,
        "HOME": str(folders["home"]),
        "XDG_DATA_HOME": str(folders["data"]),
        "XDG_CONFIG_HOME": str(folders["config"]),
        "XDG_CACHE_HOME": str(folders["cache"]),
        "ARGOS_PACKAGES_DIR": str(folders["packages"]),
        "ARGOS_DEVICE_TYPE": "cpu",
        "ARGOS_INTRA_THREADS": "1",
        "OMP_NUM_THREADS": "1",
    }
    text = tmp_path / "test.de"
    text.write_text("\n".join(lines) + "\n", encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-c", ARGOS, str(package), str(text)], env=env, capture_output=True, timeout=300
    )
    assert done.returncode == 0, done.stderr.decode()
    answer = json.loads(done.stdout.decode().splitlines()[-1])
    assert answer["package"] == ["de", "German", "en", "English", "1.0"]
    assert answer["translation"].split("\n") == expected


def test_argos_refusals(run_dir, tmp_path):
    from mtrain.config import CorpusConfig, DataConfig
    from mtrain.decode.engines.directions import RunLanguages
    from mtrain.export.argos import package_direction

    done = run_mtrain("export", f"run={run_dir}", "format=argos", f"out={tmp_path / 'de_en.zip'}", timeout=120)
    assert done.returncode != 0
    assert done.stderr.decode().strip() == (
        f"mtrain: error: out={tmp_path / 'de_en.zip'}: an Argos package is a file named *.argosmodel; "
        "e.g. out=de_en.argosmodel"
    )
    with pytest.raises(MtrainError, match="starts every source with <2en>"):
        package_direction(RunLanguages.of(DataConfig(lang_tags=True)))
    multilingual = DataConfig(corpora=[CorpusConfig(src="de", tgt="en"), CorpusConfig(src="de", tgt="fr")])
    with pytest.raises(MtrainError, match="translates de->en, de->fr"):
        package_direction(RunLanguages.of(multilingual))


@pytest.mark.parametrize("beam", [1, 4])
def test_both_engines_honour_a_prefix_and_agree(exported, model, tokenizer, sources, beam):
    """Each output starts with its prefix (some sentences have none), and CTranslate2's
    hypotheses are mtrain's, scores (prefix included) too."""
    from mtrain.decode.search.constraints import ControlIds

    cfg = DecodeConfig(beam=beam)  # (n-best lists of outputs cut at the length limit may differ)
    engine = load_ctranslate2(exported, CPU, num_threads=1)
    words = tokenizer.encode_tgt("dog cat ball")
    controls = [ControlIds(prefix=tuple(words[: i % 4])) if ids else None for i, ids in enumerate(sources)]
    expected = translate_encoded(model, tokenizer, sources, cfg, CPU, controls=controls)
    got = translate_encoded(engine, tokenizer, sources, cfg, CPU, controls=controls)
    for want, have, control in zip(expected, got, controls, strict=True):
        prefix = list(control.prefix) if control else []
        assert all(hyp.tokens[: len(prefix)] == prefix for hyp in [*want, *have])
        assert_same_nbest(have, want, cfg.length_penalty)


def test_ctranslate2_avoids_phrases_and_refuses_constraints(exported, tokenizer, sources):
    from mtrain.decode.search.constraints import ControlIds

    cfg = DecodeConfig(beam=4, nbest=4)
    engine = load_ctranslate2(exported, CPU, num_threads=1)
    plain = translate_encoded(engine, tokenizer, sources, cfg, CPU)
    avoid = [
        ControlIds(avoid=(tuple(hyps[0].tokens[:1]),)) if ids else None
        for ids, hyps in zip(sources, plain, strict=True)
    ]
    for hyps, control in zip(
        translate_encoded(engine, tokenizer, sources, cfg, CPU, controls=avoid), avoid, strict=True
    ):
        if control is not None:
            assert all(control.avoid[0][0] not in hyp.tokens for hyp in hyps)
    with pytest.raises(RefusedCombination) as refused:  # (an MtrainError) past the checks, in the checks' words
        translate_encoded(engine, tokenizer, sources[:1], cfg, CPU, controls=[ControlIds(constraints=((5,),))])
    assert refused.value.reason == CONSTRAINTS_WITH_CTRANSLATE2 and "engine=torch" in str(refused.value)
