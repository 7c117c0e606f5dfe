"""A trainer on a synthetic corpus, without a corpus on disk: what the tests of the trainer's
rules, of length buckets and of compilation build."""

from __future__ import annotations

import numpy as np
import torch

from mtrain.batches.corpus import EncodedCorpus
from mtrain.config import Precision
from mtrain.model import build_model
from mtrain.tokenizer import SpecialIds
from mtrain.train.builders import build_parts
from mtrain.train.distributed import DistributedContext
from mtrain.train.random_state import seed_everything
from mtrain.train.trainer import Trainer
from tests.fit_runs import compose_fit

IDS = SpecialIds(unk=0, pad=1, bos=2, eos=3)
VOCAB = 40


def synthetic_corpus(sentences: int = 200, seed: int = 0) -> EncodedCorpus:
    """Targets a fixed function of the sources: a task whose loss falls within a few updates."""
    rng = np.random.default_rng(seed)
    sources = [list(rng.integers(4, VOCAB, rng.integers(3, 12))) for _ in range(sentences)]
    return EncodedCorpus.from_sequences(
        [s + [IDS.eos] for s in sources], [[4 + (t * 7) % (VOCAB - 4) for t in s] for s in sources]
    )


TINY_MODEL = [
    "model.encoder_layers=1",
    "model.decoder_layers=1",
    "model.d_model=32",
    "model.heads=2",
    "model.ffn_dim=64",
    "model.dropout=0.0",
    "train.max_tokens=300",
    "train.lr=3e-3",
    "train.warmup_updates=5",
    "train.valid_bleu=false",
]


def synthetic_trainer(overrides=(), validate=None, checkpointer=None) -> Trainer:
    """A Trainer of TINY_MODEL (fit's config with `overrides`) on synthetic_corpus(); `validate`
    by default reports a constant loss."""
    cfg = compose_fit([*TINY_MODEL, *overrides])
    seed_everything(cfg.seed)
    model = build_model(cfg.model, VOCAB, VOCAB, IDS.pad, joint_vocab=True)
    parts = build_parts(model, cfg.train, cfg.seed, [synthetic_corpus()], IDS, torch.device("cpu"), Precision.fp32)
    return Trainer(
        cfg.train, parts, DistributedContext(), checkpointer=checkpointer, validate=validate or (lambda: {"loss": 1.0})
    )
