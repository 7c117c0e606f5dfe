"""`init_vocab=corpus` (mtrain/train/vocab_trim.py, mtrain/tokenizer/trimmed_vocab.py): an
imported M2M100/NLLB vocabulary keeps the rows the training corpora use. A sentence whose pieces
are all kept gets the same pieces, the same logits on the kept rows (so the log-probs of the full
model renormalised over them) and the same greedy translation as the full model restricted to
those rows; the trimmed run's `export format=hf` loads in transformers, whose tokenizer gives
the trimmed ids, and CTranslate2 converted from it decodes as transformers' generate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mtrain.checkpoint.files import load_run
from mtrain.cli.fit import run_fit
from mtrain.config import InitVocab
from mtrain.errors import MtrainError
from mtrain.export import export_hf_run
from mtrain.model import build_model
from mtrain.tokenizer import Tokenizer
from mtrain.train.init_from import load_parent
from tests.fit_runs import compose_fit
from tests.hf_runs import FIT

transformers = pytest.importorskip("transformers", reason="the M2M100/NLLB fixtures are built with transformers")

FAMILIES = {"m2m100": ("m2m100_dir", "de", "en", "__en__"), "nllb": ("nllb_dir", "deu_Latn", "eng_Latn", "eng_Latn")}
STEPS = 12  # greedy steps compared (the random models never write </s>)


@pytest.fixture(autouse=True)
def _quiet_transformers(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def _data(multi30k_slice: Path):
    return compose_fit([f"data.local_dir={multi30k_slice}", "data.train_limit=200"]).data


def _model(parent, tokenizer: Tokenizer):
    from omegaconf import OmegaConf

    from mtrain.config import ModelConfig

    cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), parent.config.model))
    model = build_model(cfg, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, tokenizer.pad_id, joint_vocab=True)
    model.load_state_dict(parent.state_dict, strict=True)
    return model.eval()


def _all_kept_lines(full: Tokenizer, trimmed: Tokenizer, lines: list[str]) -> list[str]:
    kept = set(trimmed.trimmed.kept)
    return [line for line in lines if set(full.encode_src(line)) <= kept and set(full.encode_tgt(line)) <= kept]


def _greedy(model, tokenizer: Tokenizer, source: list[int], allowed: torch.Tensor | None = None) -> list[int]:
    """Greedy decoding from `</s>` and the forced language token; pad, `<s>` and the language
    tokens are never chosen (as mtrain's decoding bans them); `allowed`: the rows it may choose."""
    src = torch.tensor([source])
    out = [tokenizer.bos_id, *tokenizer.target_prefix]
    banned = [tokenizer.pad_id, tokenizer.piece_id("<s>"), *tokenizer.tag_ids]
    with torch.no_grad():
        for _ in range(STEPS):
            logits = model(src, src.eq(tokenizer.pad_id), torch.tensor([out]))[0, -1, : tokenizer.tgt_vocab_size]
            logits[banned] = float("-inf")
            if allowed is not None:
                logits[~allowed] = float("-inf")
            out.append(int(logits.argmax()))
    return out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_sentence_of_kept_pieces_is_scored_and_translated_as_before(request, family, multi30k_slice):
    directory = request.getfixturevalue(FAMILIES[family][0])
    data = _data(multi30k_slice)
    full_parent = load_parent(str(directory), "auto", False, data)
    trimmed_parent = load_parent(str(directory), "auto", False, data, InitVocab.corpus)
    full = full_parent.tokenizer.with_languages("de", "en")
    trimmed = trimmed_parent.tokenizer.with_languages("de", "en")
    kept = trimmed.trimmed.kept
    assert trimmed.src_vocab_size == len(kept) < full.src_vocab_size
    assert trimmed_parent.lineage["vocab"] == {"kept": len(kept), "of": full.src_vocab_size, "languages": ["deu_Latn", "eng_Latn"] if family == "nllb" else ["de", "en"]}  # fmt: skip
    full_model, trimmed_model = _model(full_parent, full), _model(trimmed_parent, trimmed)
    lines = (multi30k_slice / "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()
    targets = (multi30k_slice / "test_2016_flickr.en").read_text(encoding="utf-8").splitlines()
    chosen = [i for i, line in enumerate(lines) if line in set(_all_kept_lines(full, trimmed, [line]))][:20]
    assert len(chosen) >= 10  # (the slice's test lines are mostly made of its training pieces)
    kept_rows = torch.tensor(kept)
    allowed = torch.zeros(full.tgt_vocab_size, dtype=torch.bool)
    allowed[kept_rows] = True
    to_new = {old: new for new, old in enumerate(kept)}
    compared = 0
    for index in chosen:
        source_full = full.encode_src(lines[index]) + [full.eos_id]
        source = trimmed.encode_src(lines[index]) + [trimmed.eos_id]
        assert source == [to_new[i] for i in source_full]  # the same pieces, renumbered
        target_full = [full.bos_id, *full.target_prefix, *full.encode_tgt(targets[index])]
        if not set(target_full) <= set(kept):
            continue
        target = [to_new[i] for i in target_full]
        with torch.no_grad():
            theirs = full_model(
                torch.tensor([source_full]), torch.tensor([source_full]).eq(1), torch.tensor([target_full])
            )
            ours = trimmed_model(torch.tensor([source]), torch.tensor([source]).eq(1), torch.tensor([target]))
        theirs, ours = theirs[0, :, kept_rows], ours[0, :, : len(kept)]
        assert torch.allclose(ours, theirs, atol=1e-5, rtol=0)  # the kept rows' logits
        assert torch.allclose(ours.log_softmax(-1), theirs.log_softmax(-1), atol=1e-5, rtol=0)
        assert _greedy(trimmed_model, trimmed, source) == [
            to_new[i] for i in _greedy(full_model, full, source_full, allowed)
        ]
        compared += 1
    assert compared >= 5


def test_trimming_is_refused_for_a_run_parent_and_without_init_from(tmp_path, multi30k_slice):
    with pytest.raises(MtrainError, match=r"^init_vocab: corpus trims the vocabulary of init_from=MODEL_DIR"):
        _check(["init_vocab=corpus"])
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    with pytest.raises(MtrainError, match=r"^init_vocab=corpus: init_from=.* is a run, whose vocabulary"):
        load_parent(str(tmp_path / "run"), "auto", False, _data(multi30k_slice), "corpus")


def _check(overrides):
    from mtrain.config import FitConfig, to_typed

    cfg: FitConfig = to_typed(compose_fit(overrides))
    cfg.check("")


# ------------------------------------------------------------------ the trimmed run, exported
@pytest.fixture(scope="module", params=list(FAMILIES))
def trimmed_export(request, tmp_path_factory, multi30k_slice):
    """(family, the hf export of a trimmed run after one update, the run as loaded)."""
    directory = request.getfixturevalue(FAMILIES[request.param][0])
    work = tmp_path_factory.mktemp(f"trimmed_{request.param}")
    overrides = [f"init_from={directory}", "init_vocab=corpus", f"data.local_dir={multi30k_slice}",
                 f"data.cache_dir={work / 'cache'}"]  # fmt: skip
    run_fit(compose_fit([*overrides, *FIT]), work / "run")
    out = export_hf_run(work / "run", work / "hf", which="last")
    return request.param, out, load_run(work / "run", which="last")


def test_the_trimmed_export_loads_in_transformers_with_the_trimmed_ids(trimmed_export, multi30k_slice):
    family, out, loaded = trimmed_export
    _, src_lang, tgt_lang, language = FAMILIES[family]
    hf_model = transformers.AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(out, src_lang=src_lang, tgt_lang=tgt_lang)
    tokenizer, model = loaded.tokenizer.with_languages("de", "en"), loaded.model.float().eval()
    assert hf_model.config.vocab_size == tokenizer.src_vocab_size == len(tokenizer.trimmed.kept)
    assert hf_tokenizer.convert_tokens_to_ids(language) == tokenizer.target_prefix[0]
    lines = (multi30k_slice / "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()
    kept = set(tokenizer.trimmed.kept)
    all_kept = [line for line in lines if set(tokenizer.trimmed.full.encode(line)) <= kept]  # (original ids)
    assert len(all_kept) >= 50
    # M2M100Tokenizer segments with the restricted SentencePiece model, as mtrain: every line;
    # NLLB's fast tokenizer with the kept merges: the lines whose pieces are all kept.
    for line in lines if family == "m2m100" else all_kept:
        assert hf_tokenizer(line)["input_ids"] == tokenizer.encode_src(line) + [tokenizer.eos_id], line
    source = torch.tensor([tokenizer.encode_src(all_kept[0]) + [tokenizer.eos_id]])
    target = torch.tensor([[tokenizer.bos_id, *tokenizer.target_prefix, *tokenizer.encode_tgt("A man in a park.")]])
    with torch.no_grad():
        ours = model(source, source.eq(tokenizer.pad_id), target)[..., : tokenizer.tgt_vocab_size].log_softmax(-1)
        theirs = hf_model(input_ids=source, decoder_input_ids=target).logits.log_softmax(-1)
    assert torch.allclose(ours, theirs, atol=1e-4, rtol=0)


def test_ctranslate2_converted_from_the_trimmed_nllb_export_decodes_as_generate(
    trimmed_export, multi30k_slice, tmp_path
):
    family, out, _ = trimmed_export
    ctranslate2 = pytest.importorskip("ctranslate2")
    if family == "m2m100":
        pytest.skip("CTranslate2 4.8's converter cannot read M2M100Tokenizer under transformers 5 (docs/EXPORT.md)")
    hf_model = transformers.AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(out, src_lang="deu_Latn", tgt_lang="eng_Latn")
    ctranslate2.converters.TransformersConverter(str(out)).convert(str(tmp_path / "ct2"))
    pieces = json.loads((tmp_path / "ct2" / "shared_vocabulary.json").read_text(encoding="utf-8"))
    assert len(pieces) == hf_model.config.vocab_size
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", intra_threads=1)
    forced = hf_tokenizer.convert_tokens_to_ids("eng_Latn")
    for line in (multi30k_slice / "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()[:10]:
        ids = hf_tokenizer(line)["input_ids"]
        with torch.no_grad():
            generated = hf_model.generate(
                torch.tensor([ids]), num_beams=1, forced_bos_token_id=forced, max_new_tokens=30
            )
        result = translator.translate_batch(
            [hf_tokenizer.convert_ids_to_tokens(ids)], target_prefix=[["eng_Latn"]], beam_size=1, max_decoding_length=30
        )[0]
        assert [pieces.index(p) for p in result.hypotheses[0]] == [
            i for i in generated[0].tolist()[1:] if i not in (1, 2)
        ]
