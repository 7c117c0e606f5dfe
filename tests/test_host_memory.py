"""A CPU run hands freed host memory back to the OS: every HOST_MEMORY_TRIM_EVERY updates, and
once training is over, with the optimiser's moments dropped before the test decode."""

from __future__ import annotations

import ctypes
import sys

import pytest
import torch

from mtrain import runtime
from mtrain.train import trainer as trainer_module
from tests.test_fit import TINY, compose_fit, run_fit


def _resident_kib() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim and /proc are Linux's")
def test_release_free_host_memory_returns_freed_heap_pages():
    if runtime._malloc_trim() is None:
        pytest.skip("this C library has no malloc_trim (not glibc)")
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    # 64 MiB in 64 KiB blocks (below glibc's mmap threshold: they live in the heap), touched,
    # then every block but the last freed: the free pages sit below a live block, where only
    # malloc_trim, not free, can return them.
    blocks = [libc.malloc(64 << 10) for _ in range(1024)]
    for block in blocks:
        ctypes.memset(block, 1, 64 << 10)
    for block in blocks[:-1]:
        libc.free(block)
    before = _resident_kib()
    assert runtime.release_free_host_memory() is True
    after = _resident_kib()
    libc.free(blocks[-1])
    assert before - after > 32 << 10  # more than half of the 64 MiB came back


def test_cpu_training_trims_at_its_interval_and_releases_the_optimiser_state(tmp_path, multi30k_slice, monkeypatch):
    trims, releases = [], []
    monkeypatch.setattr(trainer_module, "release_free_host_memory", lambda: trims.append(1) or True)
    original_release = trainer_module.Trainer.release_training_memory

    def release(self):
        original_release(self)
        releases.append((len(self.optimizer.state), all(p.grad is None for p in self.model.parameters())))

    monkeypatch.setattr(trainer_module.Trainer, "release_training_memory", release)
    cfg = compose_fit([f"data.local_dir={multi30k_slice}", f"data.cache_dir={tmp_path / 'cache'}", *TINY,
                       "train.valid_bleu=false", "data.train_limit=600", "train.max_updates=25",
                       "train.validate_every=1000", "train.save_every=null", "train.device=cpu"])
    metrics = run_fit(cfg, tmp_path / "run")
    assert metrics["updates"] == 25
    interval = trainer_module.HOST_MEMORY_TRIM_EVERY
    assert len(trims) == 25 // interval + 1  # updates 10 and 20, then once training is over
    assert releases == [(0, True)]  # no Adam moments, no gradients left for the test decode
    assert "test" in metrics and torch.isfinite(torch.tensor(metrics["test"]["bleu"]))
