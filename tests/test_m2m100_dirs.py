"""The M2M100/NLLB fixtures (tests/m2m100_dirs.py) are what transformers reads as the
published models' layouts: ids, language codes and config sizes."""

from __future__ import annotations

import json

import pytest

transformers = pytest.importorskip("transformers", reason="the fixtures are built with transformers")


def test_m2m100_dir_numbers_pieces_by_vocab_json_then_language_tokens(m2m100_dir):
    tokenizer = transformers.M2M100Tokenizer.from_pretrained(m2m100_dir, src_lang="de", tgt_lang="en")
    vocab = json.loads((m2m100_dir / "vocab.json").read_text(encoding="utf-8"))
    assert [vocab[p] for p in ("<s>", "<pad>", "</s>", "<unk>")] == [0, 1, 2, 3]
    assert tokenizer.get_lang_id("en") == len(vocab)  # wmt21's first code right after the table
    encoded = tokenizer("Ein Hund läuft.", text_target="A dog runs.")
    assert encoded["input_ids"][0] == tokenizer.get_lang_id("de") and encoded["input_ids"][-1] == 2
    assert encoded["labels"][0] == tokenizer.get_lang_id("en")
    config = json.loads((m2m100_dir / "config.json").read_text(encoding="utf-8"))
    assert config["architectures"] == ["M2M100ForConditionalGeneration"]
    assert config["vocab_size"] == len(vocab) + 8 + 8  # the table, wmt21's 8 codes, 8 made-up words
    assert config["decoder_start_token_id"] == 2


@pytest.mark.parametrize("legacy", [False, True], ids=["current", "legacy"])
def test_nllb_dir_appends_language_codes_after_the_offset_pieces(request, legacy, fairseq_spm):
    import sentencepiece as spm

    directory = request.getfixturevalue("nllb_legacy_dir" if legacy else "nllb_dir")
    tokenizer = transformers.NllbTokenizer.from_pretrained(directory, src_lang="deu_Latn", tgt_lang="eng_Latn")
    pieces = spm.SentencePieceProcessor(model_file=str(fairseq_spm)).get_piece_size()
    assert tokenizer.convert_tokens_to_ids("ace_Arab") == pieces + 1  # 4 specials + pieces 3.. shifted by 1
    assert tokenizer.convert_tokens_to_ids("<mask>") == len(tokenizer) - 1
    source = tokenizer("Ein Hund läuft.")["input_ids"]
    deu = tokenizer.convert_tokens_to_ids("deu_Latn")
    assert (source[-2:] == [2, deu]) if legacy else (source[0] == deu and source[-1] == 2)
    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    assert config["vocab_size"] == len(tokenizer) + 2
