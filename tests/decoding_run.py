"""What the decoding tests load: a tiny untrained model over a tokenizer, and run directories as
`mtrain fit` leaves them (tokenizer/ and checkpoints/best.pt; with a test split and the run's
languages where ensembles, MBR and reranking need them). The fixtures that build one for each
test module (`tokenizer`, `model`, `run_dir`) are in tests/conftest.py."""

from __future__ import annotations

import random
from pathlib import Path

import torch
from omegaconf import OmegaConf

from mtrain.checkpoint.files import save_checkpoint
from mtrain.config import FitConfig, ModelConfig, TranslateConfig, to_plain
from mtrain.model import build_model
from mtrain.rundir import RunDir
from mtrain.tokenizer import Tokenizer, train_or_load_tokenizer
from mtrain.train.checkpointer import data_fingerprints
from tests.word_lists import DE_EN_WORDS

# Untrained and tiny: what decoding does with the tokens, not what it translates, is under test.
TINY_MODEL = dict(encoder_layers=1, decoder_layers=2, d_model=32, heads=4, ffn_dim=64, dropout=0.0, max_positions=64)
# Short outputs keep untrained models fast: max length 0.5 * source + 3 tokens.
SHORT = dict(max_len_a=0.5, max_len_b=3)
# `mtrain translate`'s command-line overrides for an untrained tiny model: short outputs, 1 thread.
TRANSLATE_DECODE = ["decode.beam=2", "decode.max_len_a=0.5", "decode.max_len_b=3", "num_threads=1", "device=cpu"]
# The source side of a `write_test_run` run's test split.
TEST_SENTENCES = ["Zwei junge Männer stehen vor einem Gebäude.", "Ein Hund.", "Ein Mann fährt Fahrrad."]


def untrained_model(tokenizer: Tokenizer, shape: dict) -> torch.nn.Module:
    """A model of `shape` (ModelConfig's fields) over `tokenizer`'s vocabularies, initialised
    from seed 0 and in eval mode."""
    torch.manual_seed(0)
    return build_model(
        ModelConfig(**shape),
        tokenizer.src_vocab_size,
        tokenizer.tgt_vocab_size,
        tokenizer.pad_id,
        joint_vocab=tokenizer.joint,
    ).eval()


def write_run_dir(directory: Path, tokenizer: Tokenizer, model: torch.nn.Module, shape: dict) -> Path:
    """`directory` as `mtrain fit` leaves it: tokenizer/ and checkpoints/best.pt (update 7)."""
    tokenizer.save(directory / "tokenizer")
    config = to_plain(OmegaConf.structured(FitConfig(model=ModelConfig(**shape))))
    save_checkpoint(directory / "checkpoints" / "best.pt", {"model": model.state_dict(), "config": config, "update": 7})
    return directory


def write_test_run(directory: Path, tokenizer: Tokenizer, seed: int, update: int, **model) -> Path:
    """A run directory as `mtrain fit` leaves it: tokenizer/, checkpoints/best.pt (a tiny model
    initialised from `seed`, `model` overriding TINY_MODEL's fields, with the tokenizer's
    fingerprint), data/test.{src,ref}."""
    model_cfg = ModelConfig(**{**TINY_MODEL, **model})
    torch.manual_seed(seed)
    network = build_model(
        model_cfg, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, tokenizer.pad_id, joint_vocab=tokenizer.joint
    )
    run = RunDir(directory)
    tokenizer.save(run.tokenizer_dir)
    config = to_plain(OmegaConf.structured(FitConfig(model=model_cfg)))
    save_checkpoint(
        run.checkpoint("best"),
        {
            "model": network.state_dict(),
            "config": config,
            "update": update,
            "data_fingerprints": data_fingerprints("corpus", tokenizer.fingerprint),
        },
    )
    src, ref = run.split_files("test")
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_text("".join(s + "\n" for s in TEST_SENTENCES), encoding="utf-8")
    ref.write_text("Two young men.\nA dog.\nA man rides a bike.\n", encoding="utf-8")
    return directory


def write_config(run: Path, src: str, tgt: str) -> Path:
    """config.yaml as `mtrain fit` writes it, with the run's languages."""
    RunDir(run).config_file.write_text(OmegaConf.to_yaml({"data": {"src": src, "tgt": tgt}}), encoding="utf-8")
    return run


def write_tiny_run(root: Path) -> Path:
    """root/run as `mtrain fit` leaves it: tokenizer, config, three checkpoints (updates 10, 20,
    30; best.pt is 20's) of a tiny untrained model, and root/corpus, the corpus it names in
    `data.local_dir` (synthetic German-English word salad)."""
    rng = random.Random(5)
    corpus = root / "corpus"
    corpus.mkdir()
    for split, count in (("train", 300), ("val", 12), ("test", 16)):
        lines = [" ".join(rng.choice(DE_EN_WORDS) for _ in range(rng.randint(3, 9))) for _ in range(count)]
        for lang in ("de", "en"):
            (corpus / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")

    cfg = OmegaConf.structured(FitConfig)
    cfg.data.local_dir = str(corpus)
    cfg.data.cache_dir = str(root / "cache")
    cfg.data.splits.test = "test"
    cfg.tokenizer.vocab_size = 48
    cfg.model.merge_with({"encoder_layers": 1, "decoder_layers": 1, "d_model": 16, "heads": 2, "ffn_dim": 32})
    tokenizer = train_or_load_tokenizer(cfg.tokenizer, cfg.data, log=lambda *_: None)

    run = root / "run"
    tokenizer.save(run / "tokenizer")
    (run / "config.yaml").write_text(OmegaConf.to_yaml(cfg), encoding="utf-8")
    torch.manual_seed(0)
    for update in (10, 20, 30):
        model = build_model(
            cfg.model, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, tokenizer.pad_id, joint_vocab=tokenizer.joint
        )
        state = {"model": model.state_dict(), "update": update, "config": to_plain(cfg), "mtrain_version": "0.1.0"}
        save_checkpoint(run / "checkpoints" / f"update_{update}.pt", state)
        if update == 20:
            save_checkpoint(run / "checkpoints" / "best.pt", state)
    return run


def job(**overrides) -> TranslateConfig:
    """translate's config, decoding short (beam 2, at most half the source + 3 tokens), with
    `overrides` (`decode` a dict of DecodeConfig's fields)."""
    decode = overrides.pop("decode", {})
    cfg = OmegaConf.structured(TranslateConfig)
    cfg.decode = OmegaConf.merge(cfg.decode, {"beam": 2, "max_len_a": 0.5, "max_len_b": 3, **decode})
    return OmegaConf.merge(cfg, overrides)
