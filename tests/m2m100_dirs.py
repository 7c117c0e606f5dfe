"""Small M2M100- and NLLB-200-shaped model directories for the import tests, built offline
with transformers' own classes and saved with `save_pretrained`, laid out as the published ones:

- **M2M100** (facebook/m2m100_418M's files): `sentencepiece.bpe.model`, a fairseq dictionary
  `vocab.json` (`<s>` 0, `<pad>` 1, `</s>` 2, `<unk>` 3, then the pieces), the language tokens
  `__de__` after the table (here the `wmt21` list of 8 codes, which holds de and en), then
  M2M100Tokenizer's 8 `madeupwordNNNN` rows; config.json's vocab_size counts all of them.
- **NLLB-200** (facebook/nllb-200-distilled-600M's files): `sentencepiece.bpe.model` numbered
  with fairseq's offset (the four specials, then SentencePiece's piece i at i + 1), the language
  codes (`deu_Latn`) appended after the pieces and `<mask>` after them, as `tokenizer.json`
  (NllbTokenizer, transformers 5) and tokenizer_config.json hold them; config.json's vocab_size
  is 2 rows larger than the tokenizer (as the published model's 256,206 against 256,204).
  `legacy=True` writes `legacy_behaviour: true`: sources laid out `tokens </s> [lang]`.

Both share one real SentencePiece BPE model (unk 0, bos 1, eos 2, no pad: fairseq's) trained on
German and English Multi30k lines, and an M2M100ForConditionalGeneration with random weights
(std 0.3: transformers' 0.02 gives a model that writes one piece over and over)."""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import sentencepiece as spm
import torch

SPM_FILE = "sentencepiece.bpe.model"
FAIRSEQ_SPECIALS = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
M2M100_CODES = "wmt21"  # M2M100Tokenizer's short list: en ha is ja cs ru zh de
NLLB_EXTRA_ROWS = 2  # config.json's vocab_size past the tokenizer's pieces (the published model's)


def train_fairseq_spm(directory: Path, data_dir: Path, vocab_size: int = 400, lines_per_language: int = 600) -> Path:
    """A BPE SentencePiece model of German and English Multi30k training lines, fairseq's
    special ids (unk 0, bos 1, eos 2, no pad), written as `directory/sentencepiece.bpe.model`."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = []
    for lang in ("de", "en"):
        with gzip.open(data_dir / "multi30k" / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
            lines += [line for _, line in zip(range(lines_per_language), f, strict=False)]
    text = directory / "spm_train.txt"
    text.write_text("".join(lines), encoding="utf-8")
    with open(os.devnull, "w") as quiet:
        spm.SentencePieceTrainer.train(
            input=str(text),
            model_prefix=str(directory / "sentencepiece.bpe"),
            vocab_size=vocab_size,
            model_type="bpe",
            unk_id=0,
            bos_id=1,
            eos_id=2,
            pad_id=-1,
            logstream=quiet,
        )
    text.unlink()
    (directory / "sentencepiece.bpe.vocab").unlink()
    return directory / SPM_FILE


def _random_model(directory: Path, vocab_size: int, seed: int, d_model: int, layers: int, heads: int, ffn_dim: int):
    from transformers import M2M100Config, M2M100ForConditionalGeneration

    config = M2M100Config(
        vocab_size=vocab_size,
        d_model=d_model,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=ffn_dim,
        decoder_ffn_dim=ffn_dim,
        activation_function="relu",
        max_position_embeddings=128,
        scale_embedding=True,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
        dropout=0.1,
    )
    torch.manual_seed(seed)
    model = M2M100ForConditionalGeneration(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "layer_norm" not in name:
                parameter.normal_(0.0, 0.3)
        model.model.shared.weight[1].zero_()  # the padding row, as nn.Embedding(padding_idx) keeps it
    model.save_pretrained(directory)


def build_m2m100_dir(directory: Path, spm_model: Path, *, seed: int = 0, d_model: int = 32, layers: int = 2,
                     heads: int = 4, ffn_dim: int = 64) -> Path:  # fmt: skip
    """An M2M100 directory (see the module docstring) with `spm_model` as its SentencePiece model."""
    from transformers import M2M100Tokenizer

    directory.mkdir(parents=True, exist_ok=True)
    processor = spm.SentencePieceProcessor(model_file=str(spm_model))
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    vocab = dict(FAIRSEQ_SPECIALS)
    for piece in pieces:
        if piece not in ("<unk>", "<s>", "</s>"):
            vocab[piece] = len(vocab)
    work = directory / "tokenizer_work"
    work.mkdir()
    (work / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    shutil.copyfile(spm_model, work / SPM_FILE)
    tokenizer = M2M100Tokenizer(
        str(work / "vocab.json"), str(work / SPM_FILE), src_lang="de", tgt_lang="en", language_codes=M2M100_CODES
    )
    tokenizer.save_pretrained(directory)
    shutil.rmtree(work)
    # (transformers 5's len(tokenizer) counts vocab.json alone; the model has rows for all three)
    rows = len(vocab) + len(tokenizer.lang_code_to_id) + tokenizer.num_madeup_words
    _random_model(directory, rows, seed, d_model, layers, heads, ffn_dim)
    return directory


def build_nllb_dir(directory: Path, spm_model: Path, *, legacy: bool = False, seed: int = 1, d_model: int = 32,
                   layers: int = 2, heads: int = 4, ffn_dim: int = 64) -> Path:  # fmt: skip
    """An NLLB-200 directory (see the module docstring) with `spm_model` as its SentencePiece model."""
    from transformers import NllbTokenizer
    from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES

    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(spm_model, directory / SPM_FILE)
    codes = list(FAIRSEQ_LANGUAGE_CODES)
    tokenizer = NllbTokenizer.from_pretrained(
        directory, src_lang="deu_Latn", tgt_lang="eng_Latn", additional_special_tokens=codes
    )
    tokenizer.save_pretrained(directory)
    # transformers 5 converts the SentencePiece model with <mask> before the language codes;
    # the published tokenizer.json has the codes right after the pieces and <mask> last.
    saved = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))
    first = len(saved["model"]["vocab"])
    for added in saved["added_tokens"]:
        if added["content"] in codes:
            added["id"] = first + codes.index(added["content"])
        elif added["content"] == "<mask>":
            added["id"] = first + len(codes)
    (directory / "tokenizer.json").write_text(json.dumps(saved, ensure_ascii=False), encoding="utf-8")
    if legacy:
        config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
        config["legacy_behaviour"] = True
        (directory / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
    size = len(NllbTokenizer.from_pretrained(directory))
    assert size == first + len(codes) + 1, size  # the layout above, as transformers reads it back
    _random_model(directory, size + NLLB_EXTRA_ROWS, seed, d_model, layers, heads, ffn_dim)
    return directory
