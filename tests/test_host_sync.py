"""The training step never waits for the device: no host reads between log intervals.

On a GPU every `.item()`, `.cpu()`, `.tolist()`, `bool(tensor)` or `float(tensor)` blocks
the host until the device has caught up, so the next update cannot be queued meanwhile.
On CPU the same calls are counted (they are what would block on a GPU): none inside an
update or while preparing its batches, and outside them only at log intervals.
"""

from __future__ import annotations

import pytest
import torch

from mtrain.cli.fit import run_fit
from mtrain.train.batch_source import BatchSource
from mtrain.train.step import UpdateStep
from mtrain.train.trainer import Trainer
from tests.ddp_probe import run_two_ranks
from tests.fit_runs import TINY, compose_fit

SYNCING = ["item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__"]


@pytest.mark.parametrize("ema_decay", ["null", "0.99"])  # the weights' average adds no host read either
def test_no_host_reads_between_log_intervals(tmp_path, multi30k_slice, monkeypatch, ema_decay):
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
            if isinstance(self, Trainer):
                where["trainer"] = self
            previous = where["phase"]
            where["phase"] = phase
            try:
                return original(self, *args, **kwargs)
            finally:
                where["phase"] = previous

        return method

    monkeypatch.setattr(UpdateStep, "__call__", in_phase("update", UpdateStep.__call__))
    monkeypatch.setattr(BatchSource, "next_update", in_phase("batches", BatchSource.next_update))
    monkeypatch.setattr(Trainer, "fit", in_phase("loop", Trainer.fit))
    monkeypatch.setattr(Trainer, "validate_and_save", in_phase("final validation", Trainer.validate_and_save))

    cfg = compose_fit(
        [
            f"data.local_dir={multi30k_slice}",
            f"data.cache_dir={tmp_path / 'cache'}",
            *TINY,
            "train.valid_bleu=false",
            "data.train_limit=600",
            "train.max_updates=12",
            "train.log_every=4",
            "train.validate_every=1000",
            "train.save_every=null",
            f"train.ema_decay={ema_decay}",
            "data.splits.test=null",
        ]
    )
    metrics = run_fit(cfg, tmp_path / "run")
    assert metrics["updates"] == 12

    in_updates = [call for call in calls if call[0] in ("update", "batches")]
    assert in_updates == []
    loop_reads = {update for phase, update, _ in calls if phase == "loop"}
    assert loop_reads and loop_reads <= {1, 4, 8, 12}  # the first update, then every log_every


@pytest.mark.slow
def test_a_ddp_update_reads_nothing_on_the_host(tmp_path, multi30k_slice):
    """Two gloo ranks: no host read while an update runs or its batches are prepared (the job's
    token count, which an all-reduce read back gave before issue 61, comes with the batches)."""
    overrides = [
        f"data.local_dir={multi30k_slice}",
        f"data.cache_dir={tmp_path / 'cache'}",
        *TINY,
        "train.valid_bleu=false",
        "data.train_limit=600",
        "train.num_threads=1",
        "train.max_updates=8",
        "train.validate_every=1000",
        "data.splits.test=null",
    ]
    records = run_two_ranks(overrides, tmp_path / "run", agree_every_s=2.0)
    for record in records:
        assert len(record["iterations"]) == 7  # every update but the last, whose iteration ends training
        assert record["host_reads"] == []
