"""Runs for the Hugging Face export and import tests: an untrained model with its norms and biases
moved (so that a weight mapped to the wrong place shows), and a run directory with the metrics
and evaluation report that the exported model card reads."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from omegaconf import OmegaConf

from mtrain.checkpoint.files import save_checkpoint
from mtrain.config import DataConfig, FitConfig, ModelConfig, to_plain
from mtrain.model import build_model
from mtrain.tokenizer import Tokenizer
from tests.conftest import test_threads

TEST_SPLIT = "test_2016_flickr"
# A fine-tune of an imported model in one update (the import, export and trimming tests)
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


def random_model(tokenizer: Tokenizer, cfg: ModelConfig, seed: int = 1):
    """An untrained model whose norms and biases are moved away from 1 and 0."""
    torch.manual_seed(seed)
    model = build_model(
        cfg, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, tokenizer.pad_id, joint_vocab=tokenizer.joint
    ).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                parameter.add_(0.2 * torch.randn_like(parameter))
    return model


def write_run(run: Path, model, cfg: ModelConfig, tokenizer: Tokenizer, data: DataConfig | None = None) -> Path:
    """A run directory as `mtrain fit` leaves it: tokenizer/, config.yaml, checkpoints/best.pt,
    metrics.json and an evaluation report."""
    fit = OmegaConf.structured(FitConfig(model=cfg, data=data or DataConfig()))
    tokenizer.save(run / "tokenizer")
    (run / "config.yaml").write_text(OmegaConf.to_yaml(fit), encoding="utf-8")
    save_checkpoint(
        run / "checkpoints" / "best.pt", {"model": model.state_dict(), "config": to_plain(fit), "update": 250}
    )
    metrics = {"updates": 250, "epochs": 1, "train_time_s": 3.5, "device": "cpu", "precision": "fp32",
               "stop_reason": "max_updates=250 reached",
               "data": {"corpora": [{"name": "multi30k", "src": "de", "tgt": "en", "tag": None, "weight": 1.0,
                                     "train": {"kept": 2000, "src_tokens": 45000, "tgt_tokens": 41000}}]}}  # fmt: skip
    (run / "metrics.json").write_text(json.dumps(metrics), encoding="utf-8")
    report = {
        "split": "test", "split_name": TEST_SPLIT, "language_pair": "de-en", "sentences": 100,
        "checkpoint": {"which": "best", "update": 250}, "decode": {"beam": 5, "length_penalty": 1.0},
        "metrics": {"bleu": {"name": "BLEU", "score": 12.345, "signature": "nrefs:1|case:mixed|eff:no|tok:13a"}},
    }  # fmt: skip
    (run / "eval").mkdir()
    (run / "eval" / "test.json").write_text(json.dumps(report), encoding="utf-8")
    return run
