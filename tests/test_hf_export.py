"""`mtrain export format=hf`: transformers loads the directory offline and computes, tokenizes
and translates as mtrain does."""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed: format=hf is optional (pip install 'mtrain[hf]')"
)

from mtrain.config import DataConfig, DecodeConfig, ModelConfig
from mtrain.decode.translation.translator import translate_encoded
from mtrain.errors import MtrainError
from mtrain.export import export_hf_run
from mtrain.export.hf_generation import max_new_tokens
from mtrain.export.hf_model import check_hf_exportable
from mtrain.model import build_model
from mtrain.tokenizer import Tokenizer
from tests.hf_runs import TEST_SPLIT, random_model, write_run
from tests.word_lists import GERMAN_WORDS

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny models

MODEL = dict(encoder_layers=2, decoder_layers=2, d_model=64, heads=4, ffn_dim=128, dropout=0.0, max_positions=128)
CPU = torch.device("cpu")
WORDS = GERMAN_WORDS


def train_spm(
    text: Path, prefix: Path, vocab_size: int, model_type: str = "unigram", symbols: tuple[str, ...] = ()
) -> Tokenizer:
    """A joint SentencePiece model with mtrain's special ids, trained on `text`."""
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        input=str(text),
        model_prefix=str(prefix / "spm"),
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=1.0,
        unk_id=0,
        pad_id=1,
        bos_id=2,
        eos_id=3,
        minloglevel=2,
        **({"user_defined_symbols": list(symbols)} if symbols else {}),
    )
    return Tokenizer.load(prefix)


def random_sentences(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 9))) for _ in range(count)]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Tokenizer:
    """A word-level vocabulary of random words (each word one piece): sentences of a few
    pieces, which a tiny model learns to copy in seconds."""
    directory = tmp_path_factory.mktemp("spm")
    text = directory / "train.txt"
    text.write_text("\n".join(random_sentences(600, seed=3)) + "\n", encoding="utf-8")
    return train_spm(text, directory, vocab_size=40)


@pytest.fixture(scope="module")
def sentences(tokenizer) -> list[str]:
    """36 held-out sentences of random words, of the lengths the copy model learns (up to 10
    pieces: a word the vocabulary lacks is several)."""
    return [s for s in random_sentences(200, seed=99) if len(tokenizer.encode_src(s)) <= 10][:36]


@pytest.fixture(scope="module")
def multi30k_text(multi30k_slice, tmp_path_factory) -> Path:
    """The slice's 4,000 training sentences, for tokenizers of real text."""
    path = tmp_path_factory.mktemp("text") / "train.txt"
    path.write_text(
        "".join((multi30k_slice / f"train.{lang}").read_text(encoding="utf-8") for lang in ("de", "en")),
        encoding="utf-8",
    )
    return path


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
    """A tiny model trained to copy its input (seconds): its searches have clear winners,
    so both implementations must agree token for token."""
    torch.set_num_threads(1)  # module fixtures run before the per-test thread setting
    torch.manual_seed(0)
    model = build_model(
        ModelConfig(**MODEL), tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, tokenizer.pad_id, joint_vocab=True
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
def exported(tmp_path_factory, model, tokenizer) -> Path:
    """The copy model's run exported through the command."""
    from mtrain.cli.export import run_export

    run = write_run(tmp_path_factory.mktemp("run"), model, ModelConfig(**MODEL), tokenizer)
    out = tmp_path_factory.mktemp("export") / "hf"
    run_export(compose("export", [f"run={run}", "format=hf", f"out={out}"]))
    return out


@pytest.fixture(scope="module")
def loaded(exported):
    hf_model = transformers.AutoModelForSeq2SeqLM.from_pretrained(exported).eval()
    return hf_model, transformers.AutoTokenizer.from_pretrained(exported)


def compose(app: str, overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from mtrain.cli.common import CONFIG_DIR

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return hydra_compose(app, overrides=overrides)


# ------------------------------------------------------------------ the directory
def test_the_directory_loads_as_pegasus_with_mtrains_tokenizer(exported, loaded, tokenizer, sentences):
    hf_model, hf_tokenizer = loaded
    assert type(hf_model).__name__ == "PegasusForConditionalGeneration"
    assert sorted(p.name for p in exported.iterdir()) == [
        "README.md",
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "mtrain_export.json",
        "spm.model",
        "tokenizer.json",
        "tokenizer_config.json",
    ]  # fmt: skip  (spm.model: the run's SentencePiece model, which init_from reads back)
    umask = os.umask(0)
    os.umask(umask)
    assert {oct(p.stat().st_mode & 0o777) for p in exported.iterdir()} == {oct(0o666 & ~umask)}  # as plain writes
    ids = tokenizer.special_ids
    assert (hf_tokenizer.pad_token_id, hf_tokenizer.bos_token_id, hf_tokenizer.eos_token_id) == (
        ids.pad,
        ids.bos,
        ids.eos,
    )
    assert hf_tokenizer.unk_token is None  # not special: decoding writes it as SentencePiece does
    assert hf_tokenizer.model_max_length == MODEL["max_positions"]
    for sentence in [*sentences, "☃ ein mann ☃☃ spielt."]:  # unknown characters too
        encoded = hf_tokenizer(sentence)["input_ids"]
        assert encoded == tokenizer.encode_src(sentence) + [ids.eos]
        assert hf_tokenizer.decode(encoded, skip_special_tokens=True) == tokenizer.decode_tgt(encoded)


def test_generation_config_carries_mtrains_decoding(exported, tokenizer):
    generation = transformers.GenerationConfig.from_pretrained(exported)
    decode = DecodeConfig()  # the run's decode section: the defaults
    assert (generation.num_beams, generation.length_penalty, generation.early_stopping) == (5, 1.0, True)
    assert generation.min_new_tokens == decode.min_len and not generation.do_sample
    assert generation.decoder_start_token_id == tokenizer.bos_id and generation.forced_eos_token_id is None
    assert sorted(generation.suppress_tokens) == sorted([tokenizer.pad_id, tokenizer.bos_id])
    assert (generation.mtrain_max_len_a, generation.mtrain_max_len_b) == (decode.max_len_a, decode.max_len_b)
    assert generation.max_new_tokens == MODEL["max_positions"]  # the position table's limit


def test_model_card_names_data_config_and_metrics_with_signatures(exported):
    import yaml

    card = (exported / "README.md").read_text(encoding="utf-8")
    front = yaml.safe_load(card.split("---\n")[1])
    assert front["library_name"] == "transformers" and front["language"] == ["de", "en"]
    (result,) = front["model-index"][0]["results"]
    assert result["metrics"] == [
        {"type": "bleu", "name": "BLEU", "value": 12.35, "args": "nrefs:1|case:mixed|eff:no|tok:13a"}
    ]
    assert "`nrefs:1|case:mixed|eff:no|tok:13a`" in card  # the evaluation table
    assert "| multi30k | de-en |  | 1.0 | 2,000 | 45,000 | 41,000 |" in card  # the data table
    assert "250 updates" in card and "d_model: 64" in card  # training, and the stored config


def python_block(markdown: str, after: str) -> str:
    """The first ```python block of `markdown` after the text `after`."""
    start = markdown.index("```python\n", markdown.index(after)) + len("```python\n")
    return markdown[start : markdown.index("```", start)]


def test_the_card_and_the_docs_show_a_call_transformers_5_runs(exported, model, tokenizer, sentences, capsys):
    """transformers 5 has no translation pipeline; the card declares none, and the code of its
    Use section and of docs/EXPORT.md runs as written and prints mtrain's translation."""
    import yaml

    from tests.conftest import REPO_ROOT

    card = (exported / "README.md").read_text(encoding="utf-8")
    assert "pipeline_tag" not in yaml.safe_load(card.split("---\n")[1])
    with pytest.raises(KeyError, match="translation"):  # why: the tag would promise what fails
        transformers.pipeline("translation", model=str(exported))
    source = tokenizer.encode_src(sentences[0]) + [tokenizer.eos_id]
    (expected,) = translate_encoded(model, tokenizer, [source], DecodeConfig(), CPU)
    docs = (REPO_ROOT / "docs" / "EXPORT.md").read_text(encoding="utf-8")
    for code in (
        python_block(card, "## Use").replace("THIS_DIRECTORY", str(exported)).replace("SOURCE SENTENCE", sentences[0]),
        python_block(docs, "format=hf")
        .replace("runs/m30k_hf", str(exported))
        .replace("Ein Mann fährt Fahrrad.", sentences[0]),
    ):
        exec(compile(code, "snippet", "exec"), {})
        assert capsys.readouterr().out == expected[0].text + "\n"


# ------------------------------------------------------------------ the computation
def mtrain_log_probs(model, tokenizer, source: list[int], target: list[int]) -> torch.Tensor:
    src = torch.tensor([source])
    with torch.no_grad():
        logits = model(src, src.eq(tokenizer.pad_id), torch.tensor([[tokenizer.bos_id, *target]]))
    return torch.log_softmax(logits[0, :, : tokenizer.tgt_vocab_size].float(), dim=-1)


def hf_log_probs(hf_model, tokenizer, source: list[int], target: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = hf_model(
            input_ids=torch.tensor([source]), decoder_input_ids=torch.tensor([[tokenizer.bos_id, *target]])
        ).logits
    return torch.log_softmax(logits[0].float(), dim=-1)


def assert_same_log_probs(model, hf_model, tokenizer, source_text: str, target_text: str) -> None:
    source = tokenizer.encode_src(source_text) + [tokenizer.eos_id]
    target = tokenizer.encode_tgt(target_text)
    expected = mtrain_log_probs(model, tokenizer, source, target)
    got = hf_log_probs(hf_model, tokenizer, source, target)
    finite = torch.isfinite(expected)
    assert torch.equal(finite, torch.isfinite(got))  # the same pieces are impossible
    # fp32 rounding of two kernels (transformers' sdpa, mtrain's explicit softmax on the CPU):
    # up to 4e-5 on log-probs of -15
    assert torch.allclose(got[finite], expected[finite], atol=1e-4, rtol=0)


def test_log_probs_match_mtrain(loaded, model, tokenizer, sentences):
    hf_model, _ = loaded
    for source, target in zip(sentences[:6], sentences[6:12], strict=True):
        assert_same_log_probs(model, hf_model, tokenizer, source, target)


VARIANTS = {
    "gelu": dict(activation="gelu"),
    "learned": dict(positions="learned"),
    "no-positions": dict(positions="none"),
    "unscaled": dict(scale_embeddings=False),
    "untied": dict(tie_embeddings=False),
    "shared-norm": dict(shared_norm=True),
    "identity-qk": dict(cross_q_proj=False, cross_k_proj=False),
    "identity-v": dict(cross_v_proj=False),
    "padded-vocab": dict(vocab_multiple=48),
    "restricted-output": dict(output_vocab="target"),
}


@pytest.mark.parametrize("variant", VARIANTS.values(), ids=VARIANTS.keys())
def test_every_supported_switch_gives_mtrains_log_probs(variant, tokenizer, tmp_path):
    cfg = ModelConfig(**{**MODEL, **variant})
    model = random_model(tokenizer, cfg)
    if cfg.output_vocab == "target":
        model.restrict_output(sorted({*range(4, 30), tokenizer.eos_id, tokenizer.unk_id}))
    run = write_run(tmp_path / "run", model, cfg, tokenizer)
    out = export_hf_run(run, tmp_path / "hf")
    hf_model = transformers.AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    assert_same_log_probs(model, hf_model, tokenizer, "Ein Mann spielt Ball.", "Two dogs play in the park.")


# ------------------------------------------------------------------ translations
def hf_translations(
    hf_model, hf_tokenizer, sentences: list[str], cfg: DecodeConfig, batch: int = 12
) -> list[list[int]]:
    """transformers' outputs (ids without bos, eos and padding), batch by batch, each batch with
    the longest of its sentences' mtrain length limits."""
    outputs = []
    for start in range(0, len(sentences), batch):
        inputs = hf_tokenizer(sentences[start : start + batch], return_tensors="pt", padding=True)
        limit = max_new_tokens(inputs.input_ids.shape[1], cfg.max_len_a, cfg.max_len_b, MODEL["max_positions"])
        with torch.no_grad():
            generated = hf_model.generate(
                **inputs, num_beams=cfg.beam, length_penalty=cfg.length_penalty, max_new_tokens=limit
            )
        for row in generated[:, 1:].tolist():
            outputs.append(row[: row.index(hf_tokenizer.eos_token_id)] if hf_tokenizer.eos_token_id in row else row)
    return outputs


@pytest.mark.parametrize(
    "settings",
    [dict(beam=1), dict(beam=5), dict(beam=4, length_penalty=0.6)],
    ids=["greedy", "beam5", "beam4-alpha0.6"],
)
def test_generate_translates_like_mtrain(loaded, model, tokenizer, sentences, settings):
    hf_model, hf_tokenizer = loaded
    cfg = DecodeConfig(**settings)
    sources = [tokenizer.encode_src(s) + [tokenizer.eos_id] for s in sentences]
    expected = [hyps[0].tokens for hyps in translate_encoded(model, tokenizer, sources, cfg, CPU)]
    for source in sources:  # no sentence reaches its length limit: the limits cannot make a difference
        assert max_new_tokens(len(source), cfg.max_len_a, cfg.max_len_b, MODEL["max_positions"]) > len(source)
    assert hf_translations(hf_model, hf_tokenizer, sentences, cfg) == expected


def test_generate_with_its_config_alone_is_mtrains_beam5(loaded, model, tokenizer, sentences):
    """`model.generate(**inputs)` with nothing else: the exported generation config decides."""
    hf_model, hf_tokenizer = loaded
    inputs = hf_tokenizer(sentences[:8], return_tensors="pt", padding=True)
    with torch.no_grad():
        generated = hf_model.generate(**inputs)
    texts = hf_tokenizer.batch_decode(generated, skip_special_tokens=True)
    sources = [tokenizer.encode_src(s) + [tokenizer.eos_id] for s in sentences[:8]]
    assert texts == [hyps[0].text for hyps in translate_encoded(model, tokenizer, sources, DecodeConfig(), CPU)]


def test_mtrain_translate_at_fp32_gives_what_generate_gives_with_the_exported_config(
    loaded, model, tokenizer, sentences, tmp_path
):
    """The user's comparison (issue 58 item 8): `mtrain translate` through the command's own
    defaults (the request pipeline, term placement, avoided words) at precision=fp32, and
    `model.generate(**inputs)` with nothing but the exported generation config."""
    from mtrain.cli.translate import run_translate

    hf_model, hf_tokenizer = loaded
    run = write_run(tmp_path / "run", model, ModelConfig(**MODEL), tokenizer)
    source, output = tmp_path / "src.txt", tmp_path / "out.txt"
    source.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    run_translate(compose("translate", [f"run={run}", f"input={source}", f"output={output}", "precision=fp32"]))
    inputs = hf_tokenizer(sentences, return_tensors="pt", padding=True)
    with torch.no_grad():
        generated = hf_model.generate(**inputs)
    texts = hf_tokenizer.batch_decode(generated, skip_special_tokens=True)
    assert output.read_text(encoding="utf-8").splitlines() == texts


def test_the_card_says_which_mtrain_precision_transformers_matches(exported):
    card = (exported / "README.md").read_text(encoding="utf-8")
    assert "transformers decodes in float32, which gives mtrain's float32 translations (`mtrain translate " in card
    assert "precision=fp32`" in card


# ------------------------------------------------------------------ tokenizers
@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_real_text_encodes_and_decodes_as_sentencepiece(model_type, multi30k_text, multi30k_slice, tmp_path):
    from mtrain.export.hf_tokenizer import build_hf_tokenizer

    tokenizer = train_spm(multi30k_text, tmp_path, 1000, model_type)
    build_hf_tokenizer(tokenizer, [], 128).save_pretrained(tmp_path / "hf")
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    lines = [
        line
        for lang in ("de", "en")
        for line in (multi30k_slice / f"{TEST_SPLIT}.{lang}").read_text(encoding="utf-8").splitlines()
    ]
    for sentence in [*lines, "☃ Zwei  Männer ☃☃ schneiden Äste. ", ""]:  # unknown characters, spaces
        encoded = hf_tokenizer(sentence)["input_ids"]
        assert encoded == tokenizer.encode_src(sentence) + [tokenizer.eos_id]
        assert hf_tokenizer.decode(encoded, skip_special_tokens=True) == tokenizer.decode_tgt(encoded)


def test_a_multilingual_run_takes_its_target_tag_and_never_outputs_one(multi30k_text, sentences, tmp_path):
    from mtrain.config import CorpusConfig

    tags = ("<2de>", "<2en>")
    tagged = train_spm(multi30k_text, tmp_path, 1000, symbols=tags)
    data = DataConfig(lang_tags=True, corpora=[CorpusConfig(src="de", tgt="en"), CorpusConfig(src="en", tgt="de")])
    cfg = ModelConfig(**MODEL)
    model = random_model(tagged, cfg)
    out = export_hf_run(write_run(tmp_path / "run", model, cfg, tagged, data), tmp_path / "hf")
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    tag_ids = [tagged.symbol_id(tag) for tag in tags]
    for sentence in sentences[:5]:
        expected = [tag_ids[1], *tagged.encode_src(sentence), tagged.eos_id]
        assert hf_tokenizer(f"<2en> {sentence}")["input_ids"] == expected
        assert hf_tokenizer(f"<2en>{sentence}")["input_ids"] == expected
    generation = transformers.GenerationConfig.from_pretrained(out)
    assert sorted(generation.suppress_tokens) == sorted([tagged.pad_id, tagged.bos_id, *tag_ids])
    assert "`<2en>` (en), `<2de>` (de)" in (out / "README.md").read_text(encoding="utf-8")


# ------------------------------------------------------------------ refusals
REFUSED = {
    "post-norm": (dict(norm_position="post"), "model.norm_position=post: format=hf writes transformers' Pegasus"),
    "rmsnorm": (dict(norm_type="rmsnorm"), "model.norm_type=rmsnorm: .* whose norms are LayerNorm"),
    "no-final-norm": (dict(final_norm=False), "model.final_norm=False: .* ends each stack with a LayerNorm"),
    "swiglu": (dict(activation="swiglu"), "model.activation=swiglu: .* two matrices"),
    "rope": (dict(positions="rope"), "model.positions=rope: .* adds positions to the embeddings"),
    "decoder-order": (dict(decoder_order="cross_self_ffn"), "model.decoder_order=cross_self_ffn"),
    "residual": (dict(residual_input="normalized"), "model.residual_input='normalized': format=hf does not know"),
}


@pytest.mark.parametrize("variant,message", REFUSED.values(), ids=REFUSED.keys())
def test_variants_pegasus_cannot_represent_are_refused_naming_the_key(variant, message):
    with pytest.raises(MtrainError, match=message):
        check_hf_exportable(OmegaConf.structured(ModelConfig(**{**MODEL, **variant})), joint_vocab=True)


def test_separate_vocabularies_are_refused():
    with pytest.raises(MtrainError, match="tokenizer.joint=false: .* one vocabulary for source and target"):
        check_hf_exportable(ModelConfig(**MODEL), joint_vocab=False)


def test_the_command_refuses_in_one_line_with_exit_status_2(tokenizer, tmp_path, monkeypatch, capsys):
    from mtrain.cli import main as cli

    cfg = ModelConfig(**{**MODEL, "norm_position": "post"})
    run = write_run(tmp_path / "run", random_model(tokenizer, cfg), cfg, tokenizer)
    for extra, message in (
        (
            [],
            "model.norm_position=post: format=hf writes transformers' Pegasus architecture, whose layers are pre-norm",
        ),
        (["quantization=int8"], "quantization=int8: format=hf writes float32 weights"),
    ):
        monkeypatch.setattr(
            sys, "argv", ["mtrain", "export", f"run={run}", "format=hf", f"out={tmp_path / 'hf'}", *extra]
        )
        with pytest.raises(SystemExit) as exit_info:
            cli.main()
        assert exit_info.value.code == 2
        errors = capsys.readouterr().err.strip().splitlines()
        assert len(errors) == 1 and message in errors[0], errors
    assert not (tmp_path / "hf").exists()


def test_missing_transformers_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(MtrainError, match=r"transformers is not installed; .*pip install 'mtrain\[hf\]'"):
        export_hf_run(tmp_path / "run", tmp_path / "hf")
