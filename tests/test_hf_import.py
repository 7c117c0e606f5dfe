"""`init_from=` a Hugging Face directory (mtrain/train/hf_parent.py): an OPUS-MT-shaped
MarianMTModel, built offline with transformers' own classes (tests/marian_dirs.py), is read
exactly: transformers' token ids, log-probs and translations; one fine-tuning update later,
`export format=hf` writes a MarianMTModel that transformers loads and that computes what the
fine-tuned run computes. mtrain's own Pegasus export reads back bit-exactly. Refusals are one
line before any work."""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import pickle
import shutil
import time
from pathlib import Path

import pytest
import torch
import yaml
from omegaconf import OmegaConf

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed: reading HF models is optional (pip install 'mtrain[hf]')"
)

from mtrain.checkpoint.files import load_run
from mtrain.cli.fit import run_fit
from mtrain.config import DataConfig, DecodeConfig, FitConfig, ModelConfig
from mtrain.decode.translation.translator import translate_encoded
from mtrain.errors import MtrainError
from mtrain.export import export_hf_run
from mtrain.export.hf_generation import max_new_tokens
from mtrain.model import build_model
from mtrain.train.hf_config import check_memory, read_config
from mtrain.train.hf_parent import read_hf_model
from mtrain.train.init_from import inherited_config, load_parent
from tests.fit_runs import compose_fit, mtrain, one_error_line
from tests.hf_runs import FIT
from tests.marian_dirs import build_marian_dir

# MarianTokenizer recommends sacremoses, whose normaliser its encoding never calls.
pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")
CPU = torch.device("cpu")
TEST_SPLIT = "test_2016_flickr"


@pytest.fixture(autouse=True)
def _quiet_transformers(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


@pytest.fixture(scope="module")
def test_pairs(data_dir) -> list[tuple[str, str]]:
    """Multi30k's test set (2016), de-en: 1,000 pairs."""
    sides = []
    for lang in ("de", "en"):
        with gzip.open(data_dir / "multi30k" / f"{TEST_SPLIT}.{lang}.gz", "rt", encoding="utf-8") as f:
            sides.append(f.read().splitlines())
    return list(zip(*sides, strict=True))


@pytest.fixture(scope="module", params=["shared", "separate"])
def marian(request, tmp_path_factory, data_dir):
    """(directory, transformers' model, its MarianTokenizer, mtrain's model, mtrain's tokenizer),
    with one vocabulary and embedding for both sides, or one of each."""
    shared = request.param == "shared"
    # (a </s> bias that ends a good share of these random models' beam translations before the limit)
    directory = build_marian_dir(tmp_path_factory.mktemp(request.param) / "hf", data_dir, shared=shared,
                                 eos_bias=4.0 if shared else 5.0)  # fmt: skip
    hf_tokenizer = transformers.MarianTokenizer.from_pretrained(directory)
    hf_model = transformers.MarianMTModel.from_pretrained(directory).eval()
    imported = read_hf_model(directory, "test")
    tokenizer = imported.tokenizer
    model = build_model(imported.model, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, tokenizer.pad_id,
                        joint_vocab=tokenizer.joint)  # fmt: skip
    model.load_state_dict(imported.state_dict, strict=True)
    return directory, hf_model, hf_tokenizer, model.eval(), tokenizer


# ------------------------------------------------------------------ what is read
def test_the_model_is_read_as_marian_options(marian):
    directory, _, _, model, tokenizer = marian
    imported = read_hf_model(directory, "test")
    cfg = imported.model
    assert (cfg.norm_position, cfg.final_norm, cfg.positions, cfg.activation) == (
        "post",
        False,
        "sinusoidal_marian",
        "silu",
    )
    assert cfg.output_bias and cfg.scale_embeddings and cfg.tie_embeddings
    assert imported.architecture == "MarianMTModel" and imported.languages == ("de", "en")
    tied = model.src_embed.tokens.weight is model.tgt_embed.tokens.weight
    assert tied == tokenizer.joint  # one matrix for both sides only with one vocabulary
    assert model.output_proj.weight is model.tgt_embed.tokens.weight
    special = tokenizer.special_ids
    assert special.bos == special.pad  # the decoder starts from <pad>
    assert sorted(tokenizer.files) == sorted(
        ["source.spm", "target.spm", "vocab.json"] + ([] if tokenizer.joint else ["target_vocab.json"])
    )


def test_the_tokenizer_gives_transformers_ids_on_the_multi30k_test_set(marian, test_pairs):
    _, _, hf_tokenizer, _, tokenizer = marian
    eos, decoded = tokenizer.eos_id, 0
    for source, target in test_pairs:
        encoded = hf_tokenizer(source, text_target=target)
        assert encoded["input_ids"] == tokenizer.encode_src(source) + [eos]
        assert encoded["labels"] == tokenizer.encode_tgt(target) + [eos]
        if tokenizer.unk_id not in encoded["labels"]:  # transformers skips <unk>; mtrain writes ⁇
            assert hf_tokenizer.decode(encoded["labels"], skip_special_tokens=True) == tokenizer.decode_tgt(
                encoded["labels"]
            )
            decoded += 1
    assert decoded > 900


def test_teacher_forced_log_probs_equal_transformers(marian, test_pairs):
    _, hf_model, hf_tokenizer, model, tokenizer = marian
    pairs = test_pairs[:8]
    batch = hf_tokenizer([s for s, _ in pairs], text_target=[t for _, t in pairs], return_tensors="pt", padding=True)
    labels = batch["labels"]  # y </s>, padded with <pad>
    decoder_input = torch.cat([torch.full((len(pairs), 1), tokenizer.bos_id), labels[:, :-1]], dim=1)
    with torch.no_grad():
        theirs = hf_model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], decoder_input_ids=decoder_input
        ).logits.log_softmax(-1)
        ours = model(batch["input_ids"], batch["attention_mask"].eq(0), decoder_input)
        ours = ours[..., : tokenizer.tgt_vocab_size].float().log_softmax(-1)
    real = labels.ne(tokenizer.pad_id)  # positions after a sentence's </s> are nobody's
    assert torch.allclose(ours[real], theirs[real], atol=1e-4, rtol=0)


def generate(hf_model, hf_tokenizer, source: str, cfg: DecodeConfig, source_ids: list[int], eos: int, pad: int):
    """transformers' translation of one sentence under mtrain's limit for it: `limit` tokens,
    then EOS forced (transformers forces it with log-probability 0, mtrain with its own, which
    can change the ranking of beam hypotheses that reach the limit)."""
    limit = max_new_tokens(len(source_ids), cfg.max_len_a, cfg.max_len_b, 128)
    inputs = hf_tokenizer(source, return_tensors="pt")
    with torch.no_grad():
        generated = hf_model.generate(
            **inputs,
            num_beams=cfg.beam,
            length_penalty=cfg.length_penalty,
            early_stopping=True if cfg.beam > 1 else None,
            do_sample=False,
            min_new_tokens=cfg.min_len,
            max_new_tokens=limit + 1,
            forced_eos_token_id=eos,
            suppress_tokens=[pad],
        )
    row = generated[0, 1:].tolist()
    return (row[: row.index(eos)] if eos in row else row), limit


@pytest.mark.parametrize("beam", [1, 4], ids=["greedy", "beam4"])
def test_greedy_and_beam_outputs_equal_generate(marian, test_pairs, beam):
    _, hf_model, hf_tokenizer, model, tokenizer = marian
    cfg = DecodeConfig(beam=beam)
    sources = [source for source, _ in test_pairs[:16]]
    encoded = [tokenizer.encode_src(source) + [tokenizer.eos_id] for source in sources]
    ours = [hyps[0].tokens for hyps in translate_encoded(model, tokenizer, encoded, cfg, CPU)]
    within_limit = 0
    for source, ids, tokens in zip(sources, encoded, ours, strict=True):
        theirs, limit = generate(hf_model, hf_tokenizer, source, cfg, ids, tokenizer.eos_id, tokenizer.pad_id)
        if beam == 1 or len(tokens) < limit:  # (see `generate`)
            assert theirs == tokens, source
            within_limit += len(tokens) < limit
    if beam > 1:
        assert within_limit >= 4  # the comparison is not only of translations cut at the limit


# ------------------------------------------------------------------ a fine-tune, exported back


def test_one_update_then_export_loads_in_transformers_with_equal_log_probs(marian, multi30k_slice, tmp_path):
    directory, _, _, parent_model, _ = marian
    overrides = [f"init_from={directory}", f"data.local_dir={multi30k_slice}", f"data.cache_dir={tmp_path / 'cache'}"]
    run_fit(compose_fit([*overrides, *FIT]), tmp_path / "run")
    record = yaml.safe_load((tmp_path / "run" / "parent.yaml").read_text(encoding="utf-8"))
    assert record["architecture"] == "MarianMTModel" and record["from"] == str(directory.resolve())
    assert record["sha256"] == __import__("hashlib").sha256((directory / "model.safetensors").read_bytes()).hexdigest()
    loaded = load_run(tmp_path / "run", which="last")
    changed = [
        name for name, p in loaded.model.state_dict().items() if not torch.equal(p, parent_model.state_dict()[name])
    ]
    assert "output_proj.bias" in changed and len(changed) > 10  # one update trained everything

    out = export_hf_run(tmp_path / "run", tmp_path / "hf", which="last")
    for name in loaded.tokenizer.files:  # the vocabulary files as imported, byte for byte
        assert (out / name).read_bytes() == (directory / name).read_bytes()
    hf_model = transformers.AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert type(hf_model).__name__ == "MarianMTModel" and type(hf_tokenizer).__name__ == "MarianTokenizer"
    tokenizer, model = loaded.tokenizer, loaded.model.float().eval()
    source, target = "Zwei Hunde spielen im Park.", "Two dogs play in the park."
    src = torch.tensor([tokenizer.encode_src(source) + [tokenizer.eos_id]])
    tgt = torch.tensor([[tokenizer.bos_id, *tokenizer.encode_tgt(target)]])
    assert hf_tokenizer(source)["input_ids"] == src[0].tolist()
    with torch.no_grad():
        ours = model(src, src.eq(tokenizer.pad_id), tgt)[..., : tokenizer.tgt_vocab_size].float().log_softmax(-1)
        theirs = hf_model(input_ids=src, decoder_input_ids=tgt).logits.log_softmax(-1)
    assert torch.allclose(ours, theirs, atol=1e-4, rtol=0)

    # and read back once more: the same weights, bit for bit
    again = read_hf_model(out, "test")
    for name, tensor in model.state_dict().items():
        assert torch.equal(again.state_dict[name], tensor), name


def test_mtrains_own_pegasus_export_reads_back_bit_exactly(tmp_path, multi30k_spm_tokenizer):
    from tests.hf_runs import random_model, write_run

    cfg = ModelConfig(layers=1, d_model=32, heads=2, ffn_dim=64, dropout=0.0, max_positions=64, output_bias=True)
    model = random_model(multi30k_spm_tokenizer, cfg)
    with torch.no_grad():
        model.output_proj.bias.normal_()
    run = write_run(tmp_path / "run", model, cfg, multi30k_spm_tokenizer)
    out = export_hf_run(run, tmp_path / "hf")
    parent = load_parent(str(out), "auto", False, DataConfig())
    assert parent.lineage["architecture"] == "PegasusForConditionalGeneration"
    assert parent.tokenizer.fingerprint == multi30k_spm_tokenizer.fingerprint
    imported = parent.config.model
    assert (imported.positions, imported.output_bias, imported.d_model) == ("sinusoidal", True, 32)
    vocabulary = multi30k_spm_tokenizer.tgt_vocab_size
    for name, tensor in model.state_dict().items():  # (rows past the vocabulary are padding, never read)
        rows = vocabulary if name.startswith(("src_embed.tokens", "tgt_embed.tokens", "output_proj")) else None
        assert torch.equal(parent.state_dict[name][:rows], tensor[:rows]), name


# ------------------------------------------------------------------ refusals
def _broken(directory: Path, tmp_path: Path, change) -> Path:
    copy = tmp_path / "broken"
    shutil.copytree(directory, copy)
    change(copy)
    return copy


def _edit_config(key: str, value):
    def change(copy: Path) -> None:
        config = json.loads((copy / "config.json").read_text(encoding="utf-8"))
        config[key] = value
        (copy / "config.json").write_text(json.dumps(config), encoding="utf-8")

    return change


REFUSALS = {
    "architecture": (
        lambda d: (
            _edit_config("architectures", ["T5ForConditionalGeneration"])(d),
            _edit_config("model_type", "t5")(d),
        ),
        [],
        "config.json's architecture T5ForConditionalGeneration is not supported; init_from reads MarianMTModel, "
        "M2M100ForConditionalGeneration, PegasusForConditionalGeneration",
    ),
    "no-weights": (lambda d: (d / "model.safetensors").unlink(), [], "has a config.json but no weights"),
    "no-tokenizer": (lambda d: (d / "vocab.json").unlink(), [], "has no Marian tokenizer files"),
    "vocabulary-size": (_edit_config("vocab_size", 1000), [], "config.json's vocab_size=1000 but its tokenizer has"),
    "activation": (_edit_config("activation_function", "gelu_new"), [], "activation_function=gelu_new is not one of"),
    "model-key": (None, ["model.d_model=64"], "model.d_model=64: the weights of init_from="),
    "tokenizer-key": (None, ["tokenizer.vocab_size=8000"], "tokenizer.vocab_size=8000: init_from="),
    "languages": (None, ["data.src=fr"], "data: fr-en, but init_from="),
    # issue 58: malformed models, refused in one line before the run directory is written
    "heads-0": (_edit_config("encoder_attention_heads", 0), [], "config.json's encoder_attention_heads=0 must be"),
    "layers-1e9": (_edit_config("encoder_layers", 10**9), [], "config.json describes a model of"),
    "garbage-config": (
        lambda d: (d / "config.json").write_text("not json {", encoding="utf-8"),
        [],
        "config.json is not readable JSON",
    ),
    "pickle": (
        lambda d: (
            (d / "model.safetensors").unlink(),
            torch.save({"x": argparse.Namespace()}, d / "pytorch_model.bin"),
        ),
        [],
        "pytorch_model.bin is a pickle that calls argparse.Namespace; mtrain reads weights only",
    ),
    "alignment-layer": (  # 2 of the command line's 3 decoder layers, but the imported model has 2
        None,
        ["train.guided_alignment=ALIGNMENT", "train.guided_alignment_layer=2"],
        "train.guided_alignment_layer: 2 is not a layer of the 2-layer decoder",
    ),
}


@pytest.mark.parametrize("marian", ["shared"], indirect=True)  # one vocabulary layout is enough for the refusals
@pytest.mark.parametrize("refusal", REFUSALS.values(), ids=REFUSALS.keys())
def test_refusals_are_one_line_before_any_work(refusal, marian, multi30k_slice, tmp_path):
    directory = marian[0]
    change, overrides, message = refusal
    if change is not None:
        directory = _broken(directory, tmp_path, change)
    run = tmp_path / "run"
    alignment = tmp_path / "alignment.txt"  # (a line of links per training pair)
    alignment.write_text("0-0\n" * 200, encoding="utf-8")
    overrides = [override.replace("ALIGNMENT", str(alignment)) for override in overrides]
    result = mtrain(
        "fit", f"init_from={directory}", f"data.local_dir={multi30k_slice}", f"hydra.run.dir={run}", *overrides, *FIT
    )
    line = one_error_line(result)
    assert result.returncode == 2 and message in line, line
    assert not any(run.glob("*")), "nothing is written before the checks pass"


def test_a_hub_id_is_read_from_the_local_cache_only_when_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(MtrainError, match="not found in the local Hugging Face cache .HF_HUB_OFFLINE is set."):
        load_parent("Helsinki-NLP/opus-mt-de-en", "auto", False, DataConfig())


# ------------------------------------------------------------------ malformed models (issue 58)
def _drop_config(key: str):
    def change(copy: Path) -> None:
        config = json.loads((copy / "config.json").read_text(encoding="utf-8"))
        del config[key]
        (copy / "config.json").write_text(json.dumps(config), encoding="utf-8")

    return change


def _edit_weights(edit):
    def change(copy: Path) -> None:
        from safetensors.torch import load_file, save_file

        weights = load_file(str(copy / "model.safetensors"))
        edit(weights)
        save_file(weights, str(copy / "model.safetensors"), metadata={"format": "pt"})

    return change


def _sharded(weight_map):
    def change(copy: Path) -> None:
        (copy / "model.safetensors").rename(copy / "model-00001-of-00001.safetensors")
        index = {"metadata": {}, "weight_map": weight_map}
        (copy / "model.safetensors.index.json").write_text(json.dumps(index), encoding="utf-8")

    return change


def _edit_vocabulary(copy: Path) -> None:
    vocabulary = json.loads((copy / "vocab.json").read_text(encoding="utf-8"))
    vocabulary["</s>"], vocabulary["<unk>"] = False, True  # ids 0 and 1 as JSON's booleans
    (copy / "vocab.json").write_text(json.dumps(vocabulary), encoding="utf-8")


class _RunsCode:
    def __reduce__(self):
        return (print, ("this ran",))


def _code_pickle(copy: Path) -> None:
    (copy / "model.safetensors").unlink()
    with open(copy / "pytorch_model.bin", "wb") as out:
        pickle.dump({"model.shared.weight": _RunsCode()}, out)


FC1 = "model.encoder.layers.0.fc1.weight"
MALFORMED = {
    "no-d_model": (_drop_config("d_model"), "config.json has no d_model"),
    "no-layers": (_drop_config("encoder_layers"), "config.json has no encoder_layers"),
    "no-vocab_size": (_drop_config("vocab_size"), "config.json has no vocab_size"),
    "string-layers": (_edit_config("encoder_layers", "6"), 'config.json\'s encoder_layers="6" must be a whole number'),
    "float-layers": (_edit_config("decoder_layers", 1e9), "config.json's decoder_layers=1000000000.0 must be a whole"),
    "float-d_model": (_edit_config("d_model", 32.7), "config.json's d_model=32.7 must be a whole number"),
    "bool-d_model": (_edit_config("d_model", True), "config.json's d_model=true must be a whole number"),
    "architectures-5": (_edit_config("architectures", 5), "config.json's architectures=5 must be a list of strings"),
    "scale_embedding-no": (_edit_config("scale_embedding", "no"), 'config.json\'s scale_embedding="no" must be true'),
    "dropout-nan": (_edit_config("dropout", float("nan")), "config.json's dropout=NaN must be a number in [0, 1)"),
    "negative-positions": (
        _edit_config("max_position_embeddings", -5),
        "config.json's max_position_embeddings=-5 must be a whole number of at least 1",
    ),
    "string-pad-id": (_edit_config("pad_token_id", "325"), 'config.json\'s pad_token_id="325" must be a token id'),
    "heads-not-dividing": (
        lambda d: (_edit_config("encoder_attention_heads", 5)(d), _edit_config("decoder_attention_heads", 5)(d)),
        "config.json's encoder_attention_heads=5 does not divide d_model=32",
    ),
    "ffn-1e11": (
        lambda d: (_edit_config("encoder_ffn_dim", 10**11)(d), _edit_config("decoder_ffn_dim", 10**11)(d)),
        "decoder_layers=2, decoder_ffn_dim=100000000000; importing it needs at least",
    ),
    "positions-1e10": (
        _edit_config("max_position_embeddings", 10**10),
        "in the position tables (max_position_embeddings x d_model, one per stack): d_model=32, "
        "max_position_embeddings=10000000000; importing it needs at least",
    ),
    "layers-1e9": (_edit_config("encoder_layers", 10**9), "encoder_layers=1000000000, encoder_ffn_dim=64; importing"),
    "garbage-config": (
        lambda d: (d / "config.json").write_text("<html>404</html>", encoding="utf-8"),
        "config.json is not readable JSON",
    ),
    "config-list": (
        lambda d: (d / "config.json").write_text("[1, 2]", encoding="utf-8"),
        "config.json holds a JSON list",
    ),
    "weight_map-list": (_sharded(["x"]), 'model.safetensors.index.json\'s weight_map is ["x"], not an object'),
    "weight_map-outside": (
        _sharded({"model.shared.weight": "../../secret.safetensors"}),
        "weight_map names ../../secret.safetensors for model.shared.weight; a shard is a .safetensors file inside",
    ),
    "weight_map-absolute": (
        _sharded({"model.shared.weight": "/etc/passwd"}),
        "weight_map names /etc/passwd for model.shared.weight",
    ),
    "vocabulary-bool-ids": (_edit_vocabulary, "vocab.json: the piece '</s>' has the id false; ids are JSON integers"),
    "final_logits_bias-shape": (
        _edit_weights(lambda w: w.__setitem__("final_logits_bias", torch.zeros(1, 7))),
        "final_logits_bias is (1, 7), but the target vocabulary has",
    ),
    "int8-weights": (
        _edit_weights(lambda w: w.__setitem__(FC1, w[FC1].to(torch.int8))),
        f"model.safetensors's {FC1} is int8, not floating-point weights",
    ),
    "bool-weights": (
        _edit_weights(lambda w: w.__setitem__(FC1, w[FC1] > 0)),
        f"model.safetensors's {FC1} is bool, not floating-point weights",
    ),
    "nan-weights": (
        _edit_weights(lambda w: w[FC1].view(-1)[:3].fill_(float("nan"))),
        f"model.safetensors's {FC1} holds 3 NaN or infinite values",
    ),
    "layer-shape": (
        _edit_weights(lambda w: w.__setitem__(FC1, w[FC1][:, :16].contiguous())),
        f"{FC1} is (64, 16), but config.json's d_model=32 and ffn_dim=64 make it (64, 32)",
    ),
    "code-pickle": (_code_pickle, "pytorch_model.bin is a pickle that holds more than tensors; mtrain reads weights"),
}


@pytest.mark.parametrize("marian", ["shared"], indirect=True)
@pytest.mark.parametrize("case", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_model_is_refused_in_one_line_naming_file_and_key(case, marian, tmp_path, capsys):
    change, message = case
    directory = _broken(marian[0], tmp_path, change)
    started = time.perf_counter()
    with pytest.raises(MtrainError) as refused:
        load_parent(str(directory), "auto", False, DataConfig())
    line = str(refused.value)
    assert message in line and "\n" not in line, line
    assert time.perf_counter() - started < 30  # refused from the config: nothing of the model was allocated
    assert "this ran" not in capsys.readouterr().out  # (the pickle's code)


def test_the_memory_estimate_counts_opus_mts_parameters_and_refuses_what_does_not_fit(marian):
    config = read_config(marian[0] / "config.json", "test")
    ours = sum(parameter.numel() for parameter in marian[3].parameters())
    estimate = check_memory(config, marian[0] / "config.json", "test", available=1 << 40)
    # mtrain's model pads its vocabulary rows (model.vocab_multiple); the estimate adds the position tables
    padding = marian[3].src_embed.tokens.weight.numel() - config.vocab_size * config.d_model
    if not config.share_encoder_decoder_embeddings:
        padding += marian[3].tgt_embed.tokens.weight.numel() - config.target_vocab_size * config.d_model
    assert estimate == ours - padding - (marian[3].output_proj.bias.numel() - config.target_vocab_size) + 2 * 128 * 32
    opus_mt = dataclasses.replace(config, vocab_size=58101, decoder_vocab_size=58101, d_model=512,
                                  encoder_layers=6, decoder_layers=6, encoder_ffn_dim=2048, decoder_ffn_dim=2048,
                                  max_position_embeddings=512, share_encoder_decoder_embeddings=True)  # fmt: skip
    assert 74e6 < check_memory(opus_mt, Path("config.json"), "test", available=8 << 30) < 75e6  # 74M, as published
    with pytest.raises(MtrainError) as refused:
        check_memory(opus_mt, Path("config.json"), "test", available=500_000_000)
    assert str(refused.value).startswith(
        "test: config.json describes a model of 7.45e+07 parameters, 40% of them in the embeddings "
        "(vocab_size x d_model): d_model=512, vocab_size=58101; importing it needs at least 595.7 MB of memory "
        "and 500.0 MB is available"
    )


def test_an_inherited_model_config_is_checked_before_anything_is_written():
    """Issue 58 item 3: a parent's model section that `mtrain fit` would refuse on its command
    line is refused when it is inherited, naming the parent."""
    parent = OmegaConf.create({"model": {"heads": 0}, "tokenizer": {}})
    with pytest.raises(MtrainError, match=r"^model.heads: 0 must be >= 1 \(the model section of init_from=parent\)$"):
        inherited_config(FitConfig(), parent, [], "init_from=parent")
