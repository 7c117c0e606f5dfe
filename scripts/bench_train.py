#!/usr/bin/env python
"""Training throughput of a config on this machine: tokens/s, MFU and peak memory.

Runs real training updates (`Trainer.run_update`, built by `mtrain.train.setup` as `mtrain fit`
builds it) on the prepared corpus of the config and prints, per precision, target tokens/s, source+target tokens/s, updates/s,
MFU and peak memory. Several precisions (or other overrides) are measured back to back in
one process so their ratio is meaningful on a noisy machine.

    python scripts/bench_train.py experiment=multi30k_cpu --precisions fp32,bf16 --updates 60
    python scripts/bench_train.py model=transformer_base train.max_tokens=8192 --device cuda
    python scripts/bench_train.py experiment=multi30k_cpu_best --ema-decays none,0.999 --rounds 3   # EMA's cost
    python scripts/bench_train.py experiment=multi30k_cpu_best --guided-alignment train.align --rounds 3
        # guided alignment's cost: without and with train.guided_alignment=train.align, interleaved
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mtrain.cli.common import CONFIG_DIR
from mtrain.runtime import peak_host_memory_mb, resolve_device, resolve_precision
from mtrain.train.setup import prepare_fit_data, resolve_machine, setup_fit
from mtrain.train.throughput import measured_cpu_matmul_flops, model_flops_utilization, peak_flops


def peak_memory_mb(device: torch.device, reset: bool = False) -> float:
    """CUDA: peak allocated memory; CPU: the process's peak RSS. Both since the last reset, so
    that each precision measured in one process gets its own peak (where /proc allows the
    reset; otherwise the CPU figure is the process's peak so far)."""
    if device.type == "cuda":
        if reset:
            torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.max_memory_allocated(device) / 2**20
    peak = peak_host_memory_mb(reset=reset)
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def ema_milliseconds(setup, device: torch.device, calls: int = 50) -> float | None:
    """The weights' average alone (train.ema_decay): milliseconds per update, timed in isolation
    so that its share of an update can be read on a machine too noisy to see it in tokens/s."""
    ema = setup.trainer.parts.ema
    if ema is None:
        return None
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for update in range(10_000, 10_000 + calls):
        ema.update(update)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return 1000 * (time.perf_counter() - start) / calls


def measure(cfg, data, updates: int, warmup: int, trim_every: int | None = None) -> dict:
    setup = setup_fit(cfg, data=data, host_memory_trim_every=trim_every)
    trainer, device, precision = setup.trainer, setup.machine.device, setup.machine.precision
    peak_memory_mb(device, reset=True)
    tgt = src = sentences = 0
    start = None
    for step in range(warmup + updates):
        if step == warmup:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            tgt = src = sentences = 0
        stats = trainer.run_update()
        if stats is None:  # an out-of-memory batch, skipped as training skips it
            continue
        tgt += stats["tgt_tokens"]
        src += stats["src_tokens"]
        sentences += stats["sentences"]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    tgt_per_s = tgt / seconds
    flops = setup.model.flops_per_token(max(1, round(src / sentences)), max(1, round(tgt / sentences)))
    mfu = model_flops_utilization(flops, tgt_per_s, peak_flops(device, precision))
    return {
        "precision": precision,
        "ema_ms": ema_milliseconds(setup, device),
        "tgt_tok_s": tgt_per_s,
        "src_tgt_tok_s": (tgt + src) / seconds,
        "updates_s": updates / seconds,
        "mfu": mfu,
        "model_gflops": flops * tgt_per_s / 1e9,
        "peak_mb": peak_memory_mb(device),
        "loss": float(stats["loss_sum"]) / max(stats["tgt_tokens"], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the fit config")
    parser.add_argument("--precisions", default="auto", help="comma-separated: fp32,bf16,fp16,auto")
    parser.add_argument("--updates", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--trim-every",
        type=int,
        default=None,
        help="updates between returns of freed host memory to the OS (0: never; "
        "default: the trainer's, every 10 on a CPU)",
    )
    parser.add_argument(
        "--ema-decays", default=None, help="comma-separated train.ema_decay values measured back to back (none: off)"
    )
    parser.add_argument(
        "--guided-alignment", default=None, help="an alignment file: each row measured without and with it"
    )
    parser.add_argument("--rounds", type=int, default=1, help="repeat the whole list, interleaved (noisy machines)")
    args = parser.parse_args()

    overrides = [*args.overrides, f"train.device={args.device}"]
    if args.threads:
        overrides.append(f"train.num_threads={args.threads}")
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="fit", overrides=overrides)
    data = prepare_fit_data(cfg, resolve_machine(cfg), progress=lambda *_: None)
    device = resolve_device(args.device)
    print(
        f"# {device} | {torch.get_num_threads()} threads | model {cfg.model.encoder_layers}+"
        f"{cfg.model.decoder_layers} d{cfg.model.d_model} | max_tokens {cfg.train.max_tokens} | "
        f"{args.updates} timed updates after {args.warmup} warm-up"
    )
    print(
        f"{'precision':>9} {'ema':>6} {'tgt tok/s':>10} {'src+tgt/s':>10} {'upd/s':>7} {'GFLOP/s':>8} {'MFU':>7} "
        f"{'peak MB':>8}"
    )
    decays = (
        [None]
        if args.ema_decays is None
        else [
            None if value.strip().lower() in ("none", "null", "off") else float(value)
            for value in args.ema_decays.split(",")
        ]
    )
    guided_data = None
    if args.guided_alignment is not None:  # the same corpus with its alignments loaded
        cfg.train.guided_alignment = args.guided_alignment
        guided_data = prepare_fit_data(cfg, resolve_machine(cfg), progress=lambda *_: None)
    runs = [
        (round_, name, decay, guided)
        for round_ in range(args.rounds)
        for name in args.precisions.split(",")
        for decay in decays
        for guided in ([False, True] if guided_data is not None else [False])
    ]
    for round_, name, decay, guided in runs:
        precision = resolve_precision(name, device)
        cfg.train.precision = precision.value
        if args.ema_decays is not None:
            cfg.train.ema_decay = decay
        cfg.train.guided_alignment = args.guided_alignment if guided else None
        r = measure(cfg, guided_data if guided else data, args.updates, args.warmup, args.trim_every)
        if guided_data is not None:
            print(f"# guided alignment: {'on' if guided else 'off'}", flush=True)
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
        print(
            f"{r['precision']:>9} {cfg.train.ema_decay or '-'!s:>6} {r['tgt_tok_s']:>10.0f} "
            f"{r['src_tgt_tok_s']:>10.0f} {r['updates_s']:>7.2f} {r['model_gflops']:>8.1f} {mfu:>7} "
            f"{r['peak_mb']:>8.0f}",
            flush=True,
        )
        if r["ema_ms"] is not None:
            print(
                f"# the average alone: {r['ema_ms']:.2f} ms per update ({r['ema_ms'] * r['updates_s'] / 10:.2f}% "
                "of this row's update time)",
                flush=True,
            )
        if device.type == "cpu" and round_ == 0 and decay == decays[0]:
            # A CPU has no datasheet peak (no MFU); a large matmul's rate is the yardstick.
            print(
                f"# {precision} 1024x1024 matmul probe: {measured_cpu_matmul_flops(precision) / 1e9:.1f} GFLOP/s",
                flush=True,
            )


if __name__ == "__main__":
    main()
