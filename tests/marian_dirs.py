"""Small OPUS-MT-shaped model directories for the import tests, built offline with
transformers' own classes: real SentencePiece models trained on a Multi30k slice (German for
source.spm, English for target.spm, as OPUS-MT trains one per language), a vocab.json laid
out as OPUS-MT's (`</s>` 0, `<unk>` 1, the pieces, `<pad>` last; separate vocabularies: one
table per side, `<pad>` 2 in both, since a MarianMTModel has one pad id), and a
MarianMTModel with random weights (a random final_logits_bias too), saved by
`save_pretrained` beside MarianTokenizer's files.

The weights are drawn wider than transformers' initialisation (std 0.3: a model of std 0.02
outputs one piece over and over, whatever the source) and `</s>` gets a logit bias of +4, so
that translations differ between sentences and many end before mtrain's length limit."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import sentencepiece as spm
import torch


def _train_spm(directory: Path, data_dir: Path, lang: str, name: str, vocab_size: int) -> Path:
    with gzip.open(data_dir / "multi30k" / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
        lines = [line for _, line in zip(range(600), f, strict=False)]
    text = directory / f"{name}.txt"
    text.write_text("".join(lines), encoding="utf-8")
    with open(os.devnull, "w") as quiet:
        spm.SentencePieceTrainer.train(
            input=str(text),
            model_prefix=str(directory / name),
            vocab_size=vocab_size,
            unk_id=0,
            bos_id=1,
            eos_id=2,
            pad_id=-1,  # OPUS-MT's models have none: <pad> is the vocabulary's
            logstream=quiet,
        )
    text.unlink()
    model = directory / f"{name}.model"
    model.rename(directory / f"{name}.spm")
    (directory / f"{name}.vocab").unlink()
    return directory / f"{name}.spm"


def _pieces(model: Path) -> list[str]:
    processor = spm.SentencePieceProcessor(model_file=str(model))
    size = processor.get_piece_size()
    return [processor.id_to_piece(i) for i in range(size) if not (processor.is_control(i) or processor.is_unknown(i))]


def build_marian_dir(
    directory: Path,
    data_dir: Path,
    *,
    shared: bool = True,
    d_model: int = 32,
    layers: int = 2,
    heads: int = 4,
    ffn_dim: int = 64,
    activation: str = "swish",
    seed: int = 0,
    weight_std: float = 0.3,
    eos_bias: float = 4.0,
    vocab_sizes: tuple[int, int] = (200, 180),
    table_size: int | None = None,
    max_positions: int = 128,
) -> Path:
    """A MarianMTModel directory (see the module docstring); `shared`: one vocab.json and one
    embedding matrix for both sides (OPUS-MT's usual), else separate ones. `table_size`: fill
    the shared vocab.json with pieces no model segments into, up to that many entries (the
    size of OPUS-MT's tables, for scripts/bench_hf_import.py)."""
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    directory.mkdir(parents=True, exist_ok=True)
    work = directory / "spm_work"
    work.mkdir()
    source_spm = _train_spm(work, data_dir, "de", "source", vocab_sizes[0])
    target_spm = _train_spm(work, data_dir, "en", "target", vocab_sizes[1])
    if shared:
        pieces = list(dict.fromkeys(_pieces(source_spm) + _pieces(target_spm)))
        vocab = {"</s>": 0, "<unk>": 1, **{piece: i + 2 for i, piece in enumerate(pieces)}}
        while table_size is not None and len(vocab) < table_size - 1:  # OPUS-MT's size, for benchmarks
            vocab[f"▁filler{len(vocab)}"] = len(vocab)
        vocab["<pad>"] = len(vocab)
        (work / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
        tokenizer = MarianTokenizer(
            str(source_spm), str(target_spm), str(work / "vocab.json"), source_lang="de", target_lang="en"
        )
        sizes = {"vocab_size": len(vocab)}
    else:
        tables = []
        for name, model in (("vocab.json", source_spm), ("target_vocab.json", target_spm)):
            table = {"</s>": 0, "<unk>": 1, "<pad>": 2, **{p: i + 3 for i, p in enumerate(_pieces(model))}}
            (work / name).write_text(json.dumps(table, ensure_ascii=False), encoding="utf-8")
            tables.append(table)
        tokenizer = MarianTokenizer(
            str(source_spm),
            str(target_spm),
            str(work / "vocab.json"),
            target_vocab_file=str(work / "target_vocab.json"),
            separate_vocabs=True,
            source_lang="de",
            target_lang="en",
        )
        sizes = {"vocab_size": len(tables[0]), "decoder_vocab_size": len(tables[1])}
    pad = tokenizer.pad_token_id
    config = MarianConfig(
        **sizes,
        d_model=d_model,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=ffn_dim,
        decoder_ffn_dim=ffn_dim,
        activation_function=activation,
        max_position_embeddings=max_positions,
        scale_embedding=True,
        share_encoder_decoder_embeddings=shared,
        pad_token_id=pad,
        decoder_start_token_id=pad,
        eos_token_id=tokenizer.eos_token_id,
        forced_eos_token_id=tokenizer.eos_token_id,
        dropout=0.1,
    )
    torch.manual_seed(seed)
    model = MarianMTModel(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "layer_norm" not in name and "embed_positions" not in name:
                parameter.normal_(0.0, weight_std)
        # trained OPUS-MT models have one; transformers initialises it to 0
        model.final_logits_bias.normal_(0.0, 0.5)
        model.final_logits_bias[0, tokenizer.eos_token_id] += eos_bias
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    for path in work.iterdir():
        path.unlink()
    work.rmdir()
    return directory
