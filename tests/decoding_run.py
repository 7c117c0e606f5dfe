"""What the decoding tests load: a tiny untrained model over a tokenizer, and run directories as
`mtrain fit` leaves them (tokenizer/ and checkpoints/best.pt; with a test split and the run's
languages where ensembles, MBR and reranking need them). The fixtures that build one for each
test module (`tokenizer`, `model`, `run_dir`) are in tests/conftest.py."""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import OmegaConf

from mtrain.config import FitConfig, ModelConfig, to_plain
from mtrain.model import build_model
from mtrain.rundir import RunDir
from mtrain.tokenizer import Tokenizer
from mtrain.train.checkpoint_files import save_checkpoint
from mtrain.train.checkpointer import data_fingerprints

# Untrained and tiny: what decoding does with the tokens, not what it translates, is under test.
TINY_MODEL = dict(encoder_layers=1, decoder_layers=2, d_model=32, heads=4, ffn_dim=64, dropout=0.0, max_positions=64)
# Short outputs keep untrained models fast: max length 0.5 * source + 3 tokens.
SHORT = dict(max_len_a=0.5, max_len_b=3)
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
