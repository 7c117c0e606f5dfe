"""What the decoding tests load: a tiny untrained model over a tokenizer, and a run directory as
`mtrain fit` leaves it (tokenizer/ and checkpoints/best.pt). The fixtures that build them for
each test module (`tokenizer`, `model`, `run_dir`) are in tests/conftest.py."""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import OmegaConf

from mtrain.config import FitConfig, ModelConfig, to_plain
from mtrain.model import build_model
from mtrain.tokenizer import Tokenizer
from mtrain.train.checkpoint_files import save_checkpoint

# Untrained and tiny: what decoding does with the tokens, not what it translates, is under test.
TINY_MODEL = dict(encoder_layers=1, decoder_layers=2, d_model=32, heads=4, ffn_dim=64, dropout=0.0, max_positions=64)


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
