"""`init_from=` an M2M100ForConditionalGeneration directory (M2M100, NLLB-200): small random-weight
models built with transformers (tests/m2m100_dirs.py) are read exactly: transformers' token ids
on Multi30k's test set (M2M100Tokenizer, NllbTokenizer, both source layouts), teacher-forced
log-probs, greedy and beam outputs of `generate(forced_bos_token_id=...)`. Refusals are one
line before any work."""

from __future__ import annotations

import copy
import gzip
import json
import shutil

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed: reading HF models is optional (pip install 'mtrain[hf]')"
)

from mtrain.config import DataConfig, DecodeConfig
from mtrain.decode.translation.translator import translate_encoded
from mtrain.errors import MtrainError
from mtrain.export.hf_generation import max_new_tokens
from mtrain.model import build_model
from mtrain.tokenizer.fairseq_vocab import FairseqSentencePiece, fairseq_files
from mtrain.train.hf_parent import check_languages, read_hf_model

CPU = torch.device("cpu")
TEST_SPLIT = "test_2016_flickr"
FAMILIES = ["m2m100", "nllb"]


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


def hf_tokenizer(family: str, directory):
    if family == "m2m100":
        return transformers.M2M100Tokenizer.from_pretrained(directory, src_lang="de", tgt_lang="en")
    return transformers.NllbTokenizer.from_pretrained(directory, src_lang="deu_Latn", tgt_lang="eng_Latn")


@pytest.fixture(scope="module", params=FAMILIES)
def imported(request):
    """(family, directory, transformers' model, its tokenizer, mtrain's model, mtrain's de->en tokenizer)."""
    directory = request.getfixturevalue(f"{request.param}_dir")
    parent = read_hf_model(directory, "test")
    tokenizer = parent.tokenizer
    model = build_model(parent.model, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, tokenizer.pad_id,
                        joint_vocab=tokenizer.joint)  # fmt: skip
    model.load_state_dict(parent.state_dict, strict=True)
    hf_model = transformers.M2M100ForConditionalGeneration.from_pretrained(directory).eval()
    return (request.param, directory, hf_model, hf_tokenizer(request.param, directory), model.eval(),
            tokenizer.with_languages("de", "en"))  # fmt: skip


def without_unnumbered_rows(hf_model, tokenizer):
    """transformers' model without the rows no token numbers (NLLB's 2 past <mask>), which mtrain's
    import leaves out (mtrain/checkpoint/hf_m2m100.py): transformers' own resize_token_embeddings."""
    if hf_model.config.vocab_size > tokenizer.tgt_vocab_size:
        hf_model = copy.deepcopy(hf_model)
        hf_model.resize_token_embeddings(tokenizer.tgt_vocab_size)
    return hf_model


# ------------------------------------------------------------------ what is read
def test_the_model_is_read_as_mtrains_pre_ln_options(imported):
    _, directory, _, _, model, tokenizer = imported
    parent = read_hf_model(directory, "test")
    cfg = parent.model
    assert (cfg.norm_position, cfg.positions, cfg.position_offset, cfg.activation) == ("pre", "sinusoidal", 2, "relu")
    assert cfg.final_norm is not False and cfg.scale_embeddings and cfg.tie_embeddings and not cfg.output_bias
    assert parent.architecture == "M2M100ForConditionalGeneration"
    assert model.src_embed.tokens.weight is model.tgt_embed.tokens.weight is model.output_proj.weight
    special = tokenizer.special_ids
    assert (special.unk, special.pad, special.bos, special.eos) == (3, 1, 2, 2)  # the decoder starts from </s>
    assert "sentencepiece.bpe.model" in tokenizer.files


@pytest.mark.parametrize("layout", ["m2m100", "nllb", "nllb_legacy"])
def test_token_ids_equal_transformers_on_the_multi30k_test_set(request, layout, test_pairs):
    directory = request.getfixturevalue(f"{layout}_dir")
    theirs = hf_tokenizer(layout.split("_")[0], directory)
    vocab = FairseqSentencePiece(fairseq_files(directory))
    assert vocab.legacy == (layout == "nllb_legacy")
    de, en, eos, decoded = vocab.language_id("de"), vocab.language_id("en"), vocab.eos_id(), 0
    for source, target in test_pairs:
        encoded = theirs(source, text_target=target)
        if vocab.legacy:  # x </s> [lang]
            assert encoded["input_ids"] == vocab.encode(source) + [eos, de]
            assert encoded["labels"] == vocab.encode(target) + [eos, en]
        else:  # [lang] x </s>
            assert encoded["input_ids"] == [de, *vocab.encode(source), eos]
            assert encoded["labels"] == [en, *vocab.encode(target), eos]
        text_ids = vocab.encode(target)
        if vocab.unk_id() not in text_ids:  # transformers skips <unk>; mtrain writes ⁇
            assert theirs.decode(text_ids, skip_special_tokens=True) == vocab.decode(encoded["labels"])
            decoded += 1
    assert decoded > 900


def test_teacher_forced_log_probs_equal_transformers(imported, test_pairs):
    _, _, hf_model, theirs, model, tokenizer = imported
    pairs = test_pairs[:8]
    batch = theirs([s for s, _ in pairs], text_target=[t for _, t in pairs], return_tensors="pt", padding=True)
    labels = batch["labels"]  # [en] y </s>, padded
    assert batch["input_ids"][0].tolist()[: len(tokenizer.source_prefix)] == list(tokenizer.source_prefix)
    decoder_input = torch.cat([torch.full((len(pairs), 1), tokenizer.bos_id), labels[:, :-1]], dim=1)
    rows = tokenizer.tgt_vocab_size  # (NLLB's rows past its tokenizer: mtrain has none, see hf_m2m100)
    with torch.no_grad():
        hf_logits = hf_model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], decoder_input_ids=decoder_input
        ).logits
        ours = model(batch["input_ids"], batch["attention_mask"].eq(0), decoder_input)
    hf_lp = hf_logits[..., :rows].log_softmax(-1)
    ours = ours[..., :rows].float().log_softmax(-1)
    real = labels.ne(tokenizer.pad_id)
    assert torch.allclose(ours[real], hf_lp[real], atol=1e-4, rtol=0)


def generate(hf_model, theirs, source, cfg, source_ids, tokenizer, suppress):
    """transformers' translation of one sentence, forced into the target language, under mtrain's
    limit for it (see tests/test_hf_import.py's `generate`)."""
    limit = max_new_tokens(len(source_ids), cfg.max_len_a, cfg.max_len_b, 128)
    inputs = theirs(source, return_tensors="pt")
    with torch.no_grad():
        generated = hf_model.generate(
            **inputs,
            forced_bos_token_id=tokenizer.target_prefix[0],
            num_beams=cfg.beam,
            length_penalty=cfg.length_penalty,
            early_stopping=True if cfg.beam > 1 else None,
            do_sample=False,
            min_new_tokens=cfg.min_len,
            max_new_tokens=limit + 1,
            forced_eos_token_id=tokenizer.eos_id,
            suppress_tokens=suppress,
        )
    row = generated[0, 1:].tolist()  # after the </s> start: [en] y
    return (row[: row.index(tokenizer.eos_id)] if tokenizer.eos_id in row else row), limit


@pytest.mark.parametrize("beam", [1, 4], ids=["greedy", "beam4"])
def test_greedy_and_beam_outputs_equal_generate_with_the_forced_language(request, imported, test_pairs, beam):
    family, _, hf_model, theirs, model, tokenizer = imported
    if family == "nllb" and beam > 1:
        request.applymarker(
            pytest.mark.xfail(
                strict=True,
                reason="1 of 16 differs: mtrain's beam ends 'Ein sitzender Mann ...' after 12 tokens, transformers "
                "5's after 27 (a better normalised score); the 12-token hypothesis scores the same in both "
                "models (-0.91587), so the searches' stopping rules differ, not the models",
            )
        )
    cfg = DecodeConfig(beam=beam)
    sources = [source for source, _ in test_pairs[:16]]
    encoded = [tokenizer.encode_src(source) + [tokenizer.eos_id] for source in sources]
    ours = [hyps[0].tokens for hyps in translate_encoded(model, tokenizer, encoded, cfg, CPU)]
    hf_model = without_unnumbered_rows(hf_model, tokenizer)
    # what mtrain never emits: pad, the language tokens but the forced one
    suppress = [tokenizer.pad_id, *[i for i in tokenizer.tag_ids if i != tokenizer.target_prefix[0]]]
    within_limit = 0
    for source, ids, tokens in zip(sources, encoded, ours, strict=True):
        assert tokens[0] == tokenizer.target_prefix[0]
        hf_tokens, limit = generate(hf_model, theirs, source, cfg, ids, tokenizer, suppress)
        # (at the limit transformers forces </s> with log-probability 0, mtrain with its own: which
        # beam hypothesis wins among those that reach it may differ, docs/FINETUNE.md)
        if beam == 1 or max(len(tokens), len(hf_tokens)) < limit:
            assert hf_tokens == tokens, source
            within_limit += len(tokens) < limit
    if beam > 1:
        assert within_limit >= 4


# ------------------------------------------------------------------ refusals, one line each
def test_an_unknown_language_is_refused_naming_the_nearest_codes(nllb_dir, m2m100_dir):
    nllb = read_hf_model(nllb_dir, "test").tokenizer
    with pytest.raises(
        MtrainError, match=r"target language=deu_Latm: not a language of this NLLB model .* nearest: deu_Latn"
    ):
        nllb.with_languages("en", "deu_Latm")
    with pytest.raises(MtrainError, match=r"several scripts \(zho_Hans, zho_Hant\)"):
        nllb.with_languages("en", "zh")
    assert nllb.with_languages("de", "en").target_prefix == (nllb.piece_id("eng_Latn"),)
    m2m100 = read_hf_model(m2m100_dir, "test").tokenizer  # wmt21's 8 codes: no French
    with pytest.raises(MtrainError, match=r"source language=fr: not a language of this M2M100 model"):
        m2m100.with_languages("fr", "en")


def test_a_corpus_pair_outside_the_models_languages_is_refused(m2m100_dir):
    imported = read_hf_model(m2m100_dir, "test")
    check_languages(imported, DataConfig(src="de", tgt="ru"), "init_from=test")  # any pair of its languages
    with pytest.raises(MtrainError, match=r"target language=fr: not a language of this M2M100 model"):
        check_languages(imported, DataConfig(src="de", tgt="fr"), "init_from=test")


@pytest.mark.parametrize("missing", ["sentencepiece.bpe.model", "tokenizer.json+tokenizer_config.json"])
def test_a_directory_without_its_tokenizer_files_is_refused(nllb_dir, tmp_path, missing):
    copy = tmp_path / "broken"
    shutil.copytree(nllb_dir, copy)
    for name in missing.split("+"):
        (copy / name).unlink()
    with pytest.raises(MtrainError, match=r"has no M2M100/NLLB tokenizer files"):
        read_hf_model(copy, "test")


def test_a_vocabulary_larger_than_the_embedding_is_refused(m2m100_dir, tmp_path):
    copy = tmp_path / "broken"
    shutil.copytree(m2m100_dir, copy)
    config = json.loads((copy / "config.json").read_text(encoding="utf-8"))
    config["vocab_size"] = 100
    (copy / "config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(MtrainError, match=r"config.json's vocab_size=100 but its tokenizer numbers 417"):
        read_hf_model(copy, "test")


def test_nllb_600m_memory_is_estimated_from_config_before_loading(nllb_dir):
    """NLLB-200-distilled-600M's config: 615M parameters counted (the published count), refused
    in one line where the machine's memory cannot hold them."""
    config = json.loads((nllb_dir / "config.json").read_text(encoding="utf-8"))
    config.update(d_model=1024, encoder_layers=12, decoder_layers=12, encoder_attention_heads=16,
                  decoder_attention_heads=16, encoder_ffn_dim=4096, decoder_ffn_dim=4096, vocab_size=256206,
                  max_position_embeddings=1024)  # fmt: skip
    from mtrain.train.hf_config import check_memory, read_config

    path = nllb_dir / "config.json"
    big = path.parent.parent / "nllb600m.json"
    big.write_text(json.dumps(config), encoding="utf-8")
    parameters = check_memory(read_config(big, "test"), big, "test", available=10**12)
    assert 610e6 < parameters < 620e6
    with pytest.raises(
        MtrainError, match=r"of them in the embeddings \(vocab_size x d_model\): d_model=1024, vocab_size=256206"
    ):
        check_memory(read_config(big, "test"), big, "test", available=2 * 10**9)
