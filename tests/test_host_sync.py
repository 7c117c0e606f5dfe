"""The training step never waits for the device: no host reads between log intervals.

On a GPU every `.item()`, `.cpu()`, `.tolist()`, `bool(tensor)` or `float(tensor)` blocks
the host until the device has caught up, so the next update cannot be queued meanwhile.
On CPU the same calls are counted (they are what would block on a GPU): none inside an
update or while preparing its batches, and outside them only at log intervals.
"""

from __future__ import annotations

import numpy as np
import torch

from mtrain.train import trainer as trainer_module
from tests.test_fit import TINY, compose_fit, run_fit

SYNCING = ["item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__"]


def test_no_host_reads_between_log_intervals(tmp_path, multi30k_slice, monkeypatch):
    calls = []  # (where, update, method)
    where = {"phase": None, "trainer": None}

    def counted(name, original):
        def method(self, *args, **kwargs):
            trainer = where["trainer"]
            if trainer is not None:
                calls.append((where["phase"], trainer.state.update, name))
            return original(self, *args, **kwargs)
        return method

    for name in SYNCING:
        monkeypatch.setattr(torch.Tensor, name, counted(name, getattr(torch.Tensor, name)))

    def in_phase(phase, original):
        def method(self, *args, **kwargs):
            where["trainer"], previous = self, where["phase"]
            where["phase"] = phase
            try:
                return original(self, *args, **kwargs)
            finally:
                where["phase"] = previous
        return method

    Trainer = trainer_module.Trainer
    monkeypatch.setattr(Trainer, "train_step", in_phase("update", Trainer.train_step))
    monkeypatch.setattr(Trainer, "next_batches", in_phase("batches", Trainer.next_batches))
    monkeypatch.setattr(Trainer, "fit", in_phase("loop", Trainer.fit))
    monkeypatch.setattr(Trainer, "validate_and_save", in_phase("final validation", Trainer.validate_and_save))

    cfg = compose_fit([f"data.local_dir={multi30k_slice}", f"data.cache_dir={tmp_path / 'cache'}", *TINY,
                       "train.valid_bleu=false", "data.train_limit=600", "train.max_updates=12",
                       "train.log_every=4", "train.validate_every=1000", "train.save_every=null"])
    metrics = run_fit(cfg, tmp_path / "run")
    assert metrics["updates"] == 12

    in_updates = [call for call in calls if call[0] in ("update", "batches")]
    assert in_updates == []
    loop_reads = {update for phase, update, _ in calls if phase == "loop"}
    assert loop_reads and loop_reads <= {1, 4, 8, 12}  # the first update, then every log_every


def _synthetic_corpus(sentences=300, seed=0):
    from mtrain.batches.corpus import EncodedCorpus

    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, 20, sentences)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    tokens = rng.integers(4, 50, int(offsets[-1]))
    return EncodedCorpus(tokens, offsets, (tokens * 7) % 46 + 4, offsets.copy())


def test_prefetched_batches_are_the_batches_the_trainer_would_have_collated():
    """The background collation (on by default on CUDA) changes when a batch is made, never
    which: the same batches in the same order across epochs, with gradient accumulation."""
    from mtrain.model import build_model
    from mtrain.train.distributed import DistributedContext

    corpus = _synthetic_corpus()
    cfg = compose_fit(["model.encoder_layers=1", "model.decoder_layers=1", "model.d_model=16", "model.heads=2",
                       "model.ffn_dim=32", "train.max_tokens=200", "train.update_freq=2", "train.pad_to_multiple=4"])
    ids = {"pad": 1, "bos": 2, "eos": 3}
    sequences = {}
    for prefetch in (False, True):
        model = build_model(cfg.model, 50, 50, 1, joint_vocab=True)
        trainer = trainer_module.Trainer(cfg, model, corpus, ids, torch.device("cpu"), "fp32", DistributedContext(),
                                         validate=trainer_module.no_validation, prefetch=prefetch)
        assert (trainer._prefetcher is not None) == prefetch
        seen = []
        while trainer.state.epoch <= 3:
            seen.append([(b.src_tokens.tolist(), b.tgt_input.tolist(), b.tgt_output.tolist())
                         for b in trainer.next_batches()])
        sequences[prefetch] = seen
    assert len(sequences[True]) > 20 and sequences[True] == sequences[False]
