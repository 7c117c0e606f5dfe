"""Throughput accounting: tokens per second and model FLOPs utilisation (MFU).

MFU = achieved model FLOPs per second / the device's peak. The model's FLOPs per target
token come from `model.flops_per_token`; the peak comes from a table of GPU datasheet
figures (dense, no sparsity). A CPU has no such figure: a timed matrix product is only a
lower bound of its peak (it printed MFUs of 57-169% on busy or bf16-emulating CPUs), so on
a CPU no MFU is reported, only the achieved model GFLOP/s (and, for benchmarks, the
matrix-product rate of `measured_cpu_matmul_flops` to set it against).
"""

from __future__ import annotations

import time
from functools import cache

import torch

from mtrain.config import Precision

# Dense peak TFLOP/s by GPU name fragment: (bf16/fp16 tensor cores, tf32/fp32).
_GPU_PEAK_TFLOPS = {
    "H200": (989.0, 494.0),
    "H100": (989.0, 494.0),
    "A100": (312.0, 156.0),
    "L40S": (362.0, 181.0),
    "A10G": (125.0, 62.5),
    "L4": (121.0, 60.0),
    "V100": (125.0, 15.7),
    "T4": (65.0, 8.1),
}


def peak_flops(device: torch.device, precision: Precision) -> float | None:
    """Datasheet peak FLOP/s of `device` at `precision`; None for a CPU or an unknown GPU."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for fragment, (half, single) in _GPU_PEAK_TFLOPS.items():
        if fragment in name:
            return (half if Precision(precision).is_low else single) * 1e12
    return None


@cache
def measured_cpu_matmul_flops(precision: Precision, size: int = 1024, repeats: int = 4, trials: int = 5) -> float:
    """FLOP/s of a large square matmul on this CPU with the current thread count.

    The best of several trials, so that a busy machine understates the rate less. A
    benchmark figure to compare the model's GFLOP/s with, never a peak to divide by.
    """
    dtype = Precision(precision).dtype
    generator = torch.Generator().manual_seed(0)  # leave the training RNG stream untouched
    a = torch.randn(size, size, dtype=dtype, generator=generator)
    b = torch.randn(size, size, dtype=dtype, generator=generator)
    torch.mm(a, b)  # warm up kernels and caches
    best = float("inf")
    for _ in range(trials):
        start = time.perf_counter()
        for _ in range(repeats):
            torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2.0 * size**3 * repeats / best


def model_flops_utilization(
    flops_per_target_token: float, target_tokens_per_second: float, peak: float | None
) -> float | None:
    """Share (0..1) of the peak that the model's useful FLOPs reach; None without a peak, and
    None for a share above 1: the peak is then wrong (a GPU name matched to another's
    datasheet, clocks above spec), and an impossible figure must never be printed."""
    if not peak:
        return None
    share = flops_per_target_token * target_tokens_per_second / peak
    return share if share <= 1.0 else None
