"""`init_from=` a Hugging Face directory (mtrain/train/hf_parent.py): an OPUS-MT-shaped
MarianMTModel, built offline with transformers' own classes (tests/marian_dirs.py), is read
exactly: transformers' token ids, log-probs and translations; one fine-tuning update later,
`export format=hf` writes a MarianMTModel that transformers loads and that computes what the
fine-tuned run computes. mtrain's own Pegasus export reads back bit-exactly. Refusals are one
line before any work."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed: reading HF models is optional (pip install 'mtrain[hf]')"
)

from mtrain.config import DataConfig, DecodeConfig, ModelConfig
from mtrain.decode.translator import translate_encoded
from mtrain.errors import MtrainError
from mtrain.export import export_hf_run
from mtrain.export.hf_generation import max_new_tokens
from mtrain.model import build_model
from mtrain.train.checkpoint_files import load_run
from mtrain.train.hf_parent import read_hf_model
from mtrain.train.init_from import load_parent
from tests.conftest import test_threads
from tests.marian_dirs import build_marian_dir
from tests.test_fit import compose_fit, mtrain, run_fit
from tests.test_run_safety import one_error_line

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
FIT = [
    "data.train_limit=200",
    "data.splits.test=null",
    "train.max_updates=1",
    "train.validate_every=1",
    "train.valid_bleu=false",
    "train.max_tokens=1024",
    "train.lr=1e-3",
    "train.warmup_updates=1",
    "train.precision=fp32",
    f"train.num_threads={test_threads()}",
]


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
    from tests.test_hf_export import random_model, write_run

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
        "PegasusForConditionalGeneration",
    ),
    "no-weights": (lambda d: (d / "model.safetensors").unlink(), [], "has a config.json but no weights"),
    "no-tokenizer": (lambda d: (d / "vocab.json").unlink(), [], "has no Marian tokenizer files"),
    "vocabulary-size": (_edit_config("vocab_size", 1000), [], "config.json's vocab_size=1000 but its tokenizer has"),
    "activation": (_edit_config("activation_function", "gelu_new"), [], "activation_function=gelu_new is not one of"),
    "model-key": (None, ["model.d_model=64"], "model.d_model=64: the weights of init_from="),
    "tokenizer-key": (None, ["tokenizer.vocab_size=8000"], "tokenizer.vocab_size=8000: init_from="),
    "languages": (None, ["data.src=fr"], "data: fr-en, but init_from="),
}


@pytest.mark.parametrize("marian", ["shared"], indirect=True)  # one vocabulary layout is enough for the refusals
@pytest.mark.parametrize("refusal", REFUSALS.values(), ids=REFUSALS.keys())
def test_refusals_are_one_line_before_any_work(refusal, marian, multi30k_slice, tmp_path):
    directory = marian[0]
    change, overrides, message = refusal
    if change is not None:
        directory = _broken(directory, tmp_path, change)
    run = tmp_path / "run"
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
