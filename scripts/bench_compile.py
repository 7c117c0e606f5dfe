#!/usr/bin/env python
"""Eager, compiled and graph-captured training side by side, per batch size, epoch by epoch.

For each mode (`eager`; `compile`: train.compile=true; `graphs`: train.cuda_graphs=true) and
each `--max-tokens`, two epochs of the trainer's own update (`Trainer.run_update`, built by
`mtrain.train.setup` as `mtrain fit` builds it) on gpu_check's synthetic corpus (random
tokens, log-normal lengths around 28, `--pairs` pairs). Every mode trains on the same batches:
shape buckets (`--shape-buckets`, default 8) in all three, so the modes differ in nothing else.
Printed per row: batches and batch shapes per epoch, the first update's time (with compile:
tracing and code generation), target tokens/s of epoch 1 after its first update and of epoch 2
(the first epoch meets every shape first: recompiles, CUDA graph recordings), the graphs
torch.compile built, MFU of epoch 2 and peak memory.

Each mode runs in its own process with its own time limit (compile caches stay apart; a stuck
compile is reported and the next mode runs); a mode's rows are printed as they are measured.

    python scripts/bench_compile.py                                  # transformer_base bf16, one GPU
    python scripts/bench_compile.py --model transformer_big --max-tokens 16384 --json big.json
    python scripts/bench_compile.py --smoke                          # tiny, on a CPU: the script works

`--smoke` runs tiny models on a CPU with dynamo's `eager` backend (`--backend inductor`: the
real code generation, for CPU figures of compile time and compiled speed); its `graphs` mode takes the
graph-captured step's path (static loss rows, step marks) but captures nothing: a CPU has no
CUDA graphs (mtrain refuses train.cuda_graphs there; the smoke builds past that check).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace

import torch
from hydra import compose, initialize_config_dir

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_check import compile_backend, describe, peak_memory_gib, synchronize, synthetic_data

from mtrain.cli.common import CONFIG_DIR
from mtrain.runtime import decode_precision_of_training, resolve_device, resolve_precision
from mtrain.train.compilation import compiled_graphs
from mtrain.train.distributed import DistributedContext
from mtrain.train.setup import Machine, build_fit
from mtrain.train.throughput import model_flops_utilization, peak_flops

MODES = {"eager": [], "compile": ["train.compile=true"], "graphs": ["train.cuda_graphs=true"]}
TINY = [
    "model.encoder_layers=1",
    "model.decoder_layers=1",
    "model.d_model=32",
    "model.heads=2",
    "model.ffn_dim=64",
]


@dataclass
class Row:
    mode: str
    max_tokens: int
    batches_per_epoch: int = 0
    shapes: int = 0
    first_update_s: float = 0.0
    epoch1_tok_s: float = 0.0  # after its first update
    epoch2_tok_s: float = 0.0
    graphs: int | None = None  # built by torch.compile for this row (recompiles included)
    mfu: float | None = None  # of epoch 2
    peak_gib: float = 0.0
    skipped: str | None = None


def config(args: argparse.Namespace, mode: str, max_tokens: int, device: torch.device):
    overrides = [
        f"model={args.model}",
        *(TINY if args.smoke else []),
        f"train.max_tokens={max_tokens}",
        "train.update_freq=1",
        "train.max_epochs=2",
        f"train.shape_buckets={args.shape_buckets}",
        f"train.device={device}",
        f"train.precision={args.precision}",
        *MODES[mode],
    ]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose(config_name="fit", overrides=overrides)


def measure(args: argparse.Namespace, mode: str, max_tokens: int, data, device: torch.device) -> Row:
    """Two epochs of `mode` at `max_tokens`, timed epoch by epoch."""
    cfg = config(args, mode, max_tokens, device)
    precision = resolve_precision(cfg.train.precision, device)
    # Built past resolve_machine's refusal of CUDA graphs on a CPU: the smoke's graphs mode
    # runs the graph-captured step's path without a capture.
    machine = Machine(device, precision, decode_precision_of_training(precision, device), DistributedContext())
    graphs_before = compiled_graphs()
    setup = build_fit(cfg, machine, data)
    trainer, model = setup.trainer, setup.model
    per_epoch = len(trainer.parts.batches.samplers[0].batches(1))
    row = Row(mode, max_tokens, per_epoch)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    tokens = [0, 0, 0]  # the first update, the rest of epoch 1, epoch 2
    src = sentences = 0
    marks = [time.perf_counter()]
    for update in range(2 * per_epoch):
        stats = trainer.run_update()
        part = 0 if update == 0 else 1 if update < per_epoch else 2
        if stats is not None:
            tokens[part] += stats["tgt_tokens"]
            if part == 2:
                src, sentences = src + stats["src_tokens"], sentences + stats["sentences"]
        if update in (0, per_epoch - 1, 2 * per_epoch - 1):
            synchronize(device)
            marks.append(time.perf_counter())
    row.first_update_s = marks[1] - marks[0]
    row.epoch1_tok_s = tokens[1] / max(marks[2] - marks[1], 1e-9)
    row.epoch2_tok_s = tokens[2] / max(marks[3] - marks[2], 1e-9)
    row.shapes = len(trainer.parts.batches.shapes_seen)
    row.graphs = compiled_graphs() - graphs_before if mode != "eager" else None
    if sentences:
        flops = model.flops_per_token(max(1, round(src / sentences)), max(1, round(tokens[2] / sentences)))
        row.mfu = model_flops_utilization(flops, row.epoch2_tok_s, peak_flops(device, precision))
    row.peak_gib = peak_memory_gib(device)
    del trainer, model, setup
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def child(args: argparse.Namespace, device: torch.device) -> int:
    """One mode, every size, in this process: a ROW line per size as it is measured."""
    data = synthetic_data(SimpleNamespace(vocab=args.vocab, sentences=args.pairs))
    with compile_backend(args.backend):
        for max_tokens in args.sizes:
            try:
                row = measure(args, args.child, max_tokens, data, device)
            except Exception as error:  # an out-of-memory size, a failing compile: the next size runs
                row = Row(args.child, max_tokens, skipped=f"failed: {type(error).__name__}: {str(error)[:120]}")
            print("ROW " + json.dumps(asdict(row)), flush=True)
    return 0


def run_mode(argv: list[str], mode: str, sizes: list[int], limit: float) -> list[Row]:
    """`mode` in a child process with a time limit: its rows, and a skipped row per size it did not reach."""
    command = [sys.executable, str(Path(__file__).resolve()), *argv, "--child", mode]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=limit)
        output, why = done.stdout, None if done.returncode == 0 else f"failed (exit {done.returncode})"
        if why:
            why += ": " + ((done.stderr.strip().splitlines() or ["no output"])[-1])[:160]
    except subprocess.TimeoutExpired as expired:
        output = expired.stdout.decode() if isinstance(expired.stdout, bytes) else expired.stdout or ""
        why = f"timed out after {limit:.0f} s"
    rows = [Row(**json.loads(line[4:])) for line in output.splitlines() if line.startswith("ROW ")]
    done_sizes = {row.max_tokens for row in rows}
    return rows + [Row(mode, size, skipped=why or "not reached") for size in sizes if size not in done_sizes]


def table(rows: list[Row]) -> str:
    lines = [
        "| mode | max_tokens | batches/epoch | shapes | first update s | epoch 1 tgt tok/s | epoch 2 tgt tok/s "
        "| epoch 1 / 2 | graphs | MFU (epoch 2) | peak GiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in sorted(rows, key=lambda r: (r.max_tokens, list(MODES).index(r.mode))):
        if row.skipped:
            lines.append(f"| {row.mode} | {row.max_tokens:,} | skipped: {row.skipped} | | | | | | | | |")
            continue
        ratio = row.epoch1_tok_s / row.epoch2_tok_s if row.epoch2_tok_s else float("nan")
        mfu = f"{100 * row.mfu:.1f}%" if row.mfu is not None else "n/a"
        lines.append(
            f"| {row.mode} | {row.max_tokens:,} | {row.batches_per_epoch} | {row.shapes} | {row.first_update_s:.1f} "
            f"| {row.epoch1_tok_s:,.0f} | {row.epoch2_tok_s:,.0f} | {ratio:.2f} "
            f"| {'' if row.graphs is None else row.graphs} | {mfu} | {row.peak_gib:.2f} |"
        )
    return "\n".join(lines)


def speedups(rows: list[Row]) -> str:
    """Epoch 2's tokens/s of compile and graphs against eager's, per size."""
    by = {(row.mode, row.max_tokens): row for row in rows if not row.skipped}
    parts = []
    for size in sorted({row.max_tokens for row in rows}):
        eager = by.get(("eager", size))
        for mode in ("compile", "graphs"):
            other = by.get((mode, size))
            if eager and other and eager.epoch2_tok_s:
                parts.append(f"{mode} {other.epoch2_tok_s / eager.epoch2_tok_s:.2f}x eager at {size:,}")
    return "; ".join(parts) or "no pair of rows to compare"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny models on a CPU (dynamo's eager backend)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--model", default="transformer_base")
    parser.add_argument("--precision", default="bf16")
    parser.add_argument("--modes", default="eager,graphs,compile", help="run in this order")
    parser.add_argument("--max-tokens", default=None, help="comma-separated batch sizes (default 4096,16384,65536)")
    parser.add_argument("--pairs", type=int, default=None, help="synthetic pairs per epoch (default 12,000)")
    parser.add_argument("--shape-buckets", type=int, default=8)
    parser.add_argument(
        "--backend", default=None, help="torch.compile's backend (default: eager with --smoke, else inductor)"
    )
    parser.add_argument("--budget", type=float, default=170.0, help="seconds for all modes: a mode gets what is left")
    parser.add_argument("--mode-timeout", type=float, default=90.0, help="seconds a mode may take (eager: half)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one mode in this process
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    args.backend = args.backend or ("eager" if args.smoke else "inductor")
    default_sizes = "512,1024,2048" if args.smoke else "4096,16384,65536"
    args.sizes = [int(size) for size in (args.max_tokens or default_sizes).split(",")]
    args.pairs = args.pairs or (600 if args.smoke else 12_000)
    args.vocab = 256 if args.smoke else 32_768
    for mode in args.modes.split(","):
        if mode not in MODES:
            parser.error(f"--modes: {mode!r} is not one of {', '.join(MODES)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.perf_counter()
    device = resolve_device(args.device)
    if device.type != "cuda" and not args.smoke:
        print("bench_compile: no CUDA device here; use --smoke to check the script on a CPU", file=sys.stderr)
        return 2
    if device.type == "cpu":
        torch.set_num_threads(1)  # tiny models: more threads only contend
    if args.child:
        return child(args, device)
    date = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    print(f"# mtrain compile bench{' (smoke: tiny models, no capture)' if args.smoke else ''} | {date}")
    print(
        f"# {describe(device)}; {args.model} {args.precision}, {args.pairs:,} synthetic pairs an epoch, "
        f"{args.shape_buckets} shape buckets in every mode; each mode in its own process",
        flush=True,
    )
    rows: list[Row] = []
    for mode in args.modes.split(","):
        left = args.budget - (time.perf_counter() - began)
        limit = min(args.mode_timeout / (2 if mode == "eager" else 1), left)
        if limit < 5:
            rows += [Row(mode, size, skipped=f"past the {args.budget:.0f} s budget") for size in args.sizes]
        else:
            rows += run_mode(args.argv, mode, args.sizes, limit)
        print(f"# {mode}: done at {time.perf_counter() - began:.0f} s", flush=True)
    print(table(rows))
    print(f"\n# epoch 2: {speedups(rows)}\n# total {time.perf_counter() - began:.0f} s")
    if args.json:
        result = {"date": date, "device": describe(device), "smoke": args.smoke, "model": args.model}
        result.update(precision=args.precision, pairs=args.pairs, rows=[asdict(row) for row in rows])
        args.json.write_text(json.dumps(result, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
