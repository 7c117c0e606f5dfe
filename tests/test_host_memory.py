"""A CPU run's host memory: freed memory goes back to the OS (every HOST_MEMORY_TRIM_EVERY
updates, before a validation, and once training is over, with the optimiser's moments dropped
before the test decode); bf16 products keep a bounded cache of primitives; a read-only
checkpoint load leaves the optimiser's state on disk; fit reports its peaks per phase."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from mtrain import runtime
from mtrain.cli.fit import run_fit
from mtrain.train import host_memory as host_memory_module
from mtrain.train import trainer as trainer_module
from tests.fit_runs import TINY, compose_fit


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
    for module in (trainer_module, host_memory_module):  # the interval's trims, and validation's and the end's
        monkeypatch.setattr(module, "release_free_host_memory", lambda: trims.append(1) or True)
    original_release = trainer_module.Trainer.release_training_memory

    def release(self):
        original_release(self)
        releases.append((len(self.optimizer.state), all(p.grad is None for p in self.model.parameters())))

    monkeypatch.setattr(trainer_module.Trainer, "release_training_memory", release)
    cfg = compose_fit(
        [
            f"data.local_dir={multi30k_slice}",
            f"data.cache_dir={tmp_path / 'cache'}",
            *TINY,
            "train.valid_bleu=false",
            "data.train_limit=600",
            "train.max_updates=25",
            "train.validate_every=1000",
            "train.save_every=null",
            "train.device=cpu",
        ]
    )
    metrics = run_fit(cfg, tmp_path / "run")
    assert metrics["updates"] == 25
    interval = host_memory_module.HOST_MEMORY_TRIM_EVERY
    # updates 10 and 20, before the final validation, and once training is over
    assert len(trims) == 25 // interval + 2
    assert releases == [(0, True)]  # no Adam moments, no gradients left for the test decode
    assert "test" in metrics and torch.isfinite(torch.tensor(metrics["test"]["bleu"]))
    if sys.platform.startswith("linux"):  # VmHWM: each phase's peak, at least the model's size
        assert set(metrics["peak_rss_mb"]) == {"training", "validation", "test"}
        assert all(100 < peak < 100_000 for peak in metrics["peak_rss_mb"].values())


_BF16_PRODUCTS_OF_400_SHAPES = textwrap.dedent("""
    import mtrain.runtime, torch
    def resident_mb():
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024
    linear = torch.nn.Linear(256, 1024)
    before = resident_mb()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for rows in range(1, 401):
            linear(torch.randn(rows, 256))
    print(resident_mb() - before)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="resident memory is read from /proc")
def test_bf16_products_keep_a_bounded_cache_of_shapes():
    if not runtime.cpu_has_bf16_matmul():
        pytest.skip("bf16 products are emulated on this CPU: oneDNN's primitives are not used")

    def growth(extra_env):
        env = {key: value for key, value in os.environ.items() if key != "LRU_CACHE_CAPACITY"}
        result = subprocess.run(
            [sys.executable, "-c", _BF16_PRODUCTS_OF_400_SHAPES],
            env={**env, **extra_env},
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        return float(result.stdout.split()[-1])

    bounded, torch_default = growth({}), growth({"LRU_CACHE_CAPACITY": "1024"})
    # Measured: ~54 MB with mtrain's 64 primitives, ~180 MB with torch's 1,024.
    assert bounded < torch_default - 60, (bounded, torch_default)


def _present_fraction(tensor: torch.Tensor) -> float:
    """The share of the memory pages under `tensor`'s storage that this process has in memory
    (bit 63 of /proc/self/pagemap: present in its page tables, file-backed or not). Unlike a
    difference of VmRSS, it does not depend on what the allocator kept from earlier tests."""
    page = os.sysconf("SC_PAGE_SIZE")
    first = tensor.untyped_storage().data_ptr() // page
    last = (tensor.untyped_storage().data_ptr() + tensor.untyped_storage().nbytes() - 1) // page
    with open("/proc/self/pagemap", "rb") as pagemap:
        pagemap.seek(first * 8)
        entries = memoryview(pagemap.read((last - first + 1) * 8)).cast("Q")
    return sum(entry >> 63 for entry in entries) / len(entries)


@pytest.mark.skipif(not os.access("/proc/self/pagemap", os.R_OK), reason="residency is read from /proc/self/pagemap")
def test_read_only_checkpoint_loads_leave_the_optimiser_state_on_disk(tmp_path):
    from mtrain.checkpoint.files import load_checkpoint, save_checkpoint

    path = tmp_path / "update_1.pt"
    weight = torch.arange(1000, dtype=torch.float32)
    moments = torch.ones(4 << 20)  # 16 MiB of "optimiser state", never read by a decode
    save_checkpoint(path, {"model": {"weight": weight}, "optimizer": {"exp_avg": moments}})
    del moments
    mapped = load_checkpoint(path, mmap=True)
    assert torch.equal(mapped["model"]["weight"], weight)  # read: in memory, so the measure sees file pages
    present = {
        "mapped weight": _present_fraction(mapped["model"]["weight"]),
        "mapped moments": _present_fraction(mapped["optimizer"]["exp_avg"]),
    }
    read = load_checkpoint(path)
    present["read moments"] = _present_fraction(read["optimizer"]["exp_avg"])
    assert read["optimizer"]["exp_avg"].sum() == 4 << 20
    # Measured: 1.0, 0.004 (the kernel maps a few neighbouring pages with the weight's), 1.0.
    assert present["mapped weight"] == 1.0 and present["mapped moments"] < 0.1, present
    assert present["read moments"] > 0.9, present
