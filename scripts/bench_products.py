"""GFLOP/s of a Transformer layer's matrix products, one by one, against a 1024³ probe.

    python scripts/bench_products.py                          # the CPU benchmark model, 2 threads
    python scripts/bench_products.py --dtype bf16             # as bf16 autocast multiplies
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 python scripts/bench_products.py

Each Linear of the model (rows = tokens in a batch) costs three products per update: the
forward (x W^T + b), the input gradient (dy W) and the weight gradient (dy^T x). This times
each of them alone, in fp32, for the shapes of the benchmark model (d_model 256, FFN 1024, the
fused W_Q/W_K/W_V and W_K/W_V of cross-attention, the target-side output vocabulary), and the
1024x1024x1024 product in the same run: if the shapes run near the probe's rate, the products
are not where an update loses time (docs/PERFORMANCE.md, issue 16).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch


def gflops(product: Callable[[], torch.Tensor], flops: float, repeats: int) -> float:
    product(), product()  # warm-up: first calls allocate and pick kernels
    start = time.perf_counter()
    for _ in range(repeats):
        product()
    return flops * repeats / (time.perf_counter() - start) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2048, help="tokens per batch")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--ffn", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=3960, help="output rows (Multi30k target side: 3,960)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument(
        "--dtype",
        choices=["fp32", "bf16"],
        default="fp32",
        help="bf16: the products as bf16 autocast runs them (oneDNN on a CPU with bf16 instructions)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    d, rows = args.d_model, args.rows
    shapes = {
        "W_Q/W_K/W_V": (d, 3 * d),
        "W_O": (d, d),
        "cross W_K/W_V": (d, 2 * d),
        "FFN up": (d, args.ffn),
        "FFN down": (args.ffn, d),
        "output": (d, args.vocab),
    }
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    print(f"# {args.dtype}, {rows} rows, {args.threads} threads, GFLOP/s")
    print(f"{'product':14s} {'in':>5s} {'out':>5s} {'forward':>8s} {'d input':>8s} {'d weight':>8s}")
    for name, (fan_in, fan_out) in shapes.items():
        x, weight = torch.randn(rows, fan_in, dtype=dtype), torch.randn(fan_out, fan_in, dtype=dtype)
        bias, grad = torch.randn(fan_out, dtype=dtype), torch.randn(rows, fan_out, dtype=dtype)
        flops = 2.0 * rows * fan_in * fan_out
        rates = [
            gflops(product, flops, args.repeats)
            for product in (
                lambda x=x, weight=weight, bias=bias: torch.addmm(bias, x, weight.t()),
                lambda grad=grad, weight=weight: grad.mm(weight),
                lambda grad=grad, x=x: grad.t().mm(x),
            )
        ]
        print(f"{name:14s} {fan_in:5d} {fan_out:5d} " + " ".join(f"{rate:8.1f}" for rate in rates))
    a, b = torch.randn(1024, 1024, dtype=dtype), torch.randn(1024, 1024, dtype=dtype)
    print(f"# 1024x1024x1024 probe: {gflops(lambda: a.mm(b), 2.0 * 1024**3, args.repeats):.1f} GFLOP/s")


if __name__ == "__main__":
    main()
