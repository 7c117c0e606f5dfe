#!/usr/bin/env python
"""GPU check: training speed of transformer_base and transformer_big, and bf16 against fp32.

1. Tracking: transformer_base (dropout off), the same initial weights and the same batches,
   `--track-updates` updates in fp32 and in bf16 (lr warmed up in 10 updates so the loss
   moves). The bf16 loss, averaged over the last 10 updates, must be within `--tolerance`
   (relative, default 2%) of fp32's; otherwise the exit status is 1.
2. Speed: for each model and mode (bf16, fp32, bf16+compile), warm-up updates, then timed
   updates until `--updates` or `--seconds` per mode, whichever comes first. Printed:
   target tokens/s, source+target tokens/s, MFU (`model.flops_per_token` x target tokens/s
   / the datasheet peak of `mtrain.train.throughput.peak_flops`; none on a CPU) and peak memory.

Everything runs the trainer's own update (`Trainer.run_update`, built by `mtrain.train.setup` as
`mtrain fit` builds it, with its batch source and `collate`) on a synthetic corpus: random tokens, lengths around 30 (log-normal), targets a
fixed permutation of the source tokens (a task the model can learn, so the loss falls).
Every row (and the tracking check) runs in a child process with its own time limit
(`--row-timeout`, longer for compile rows): a row that hangs or crashes is reported as such and
the next one runs. The whole check keeps within `--budget` (default 230 s): a row gets at most
the time left, and rows that would not fit are skipped and say so; rows are printed as they
are measured.

`--profile` adds, for transformer_big in bf16 (the first model in smoke mode), a
`torch.profiler` breakdown of a few updates: the top kernels by device time, how much of
the wall time per update the device was busy (on a GPU), the host-device
synchronisations per update (`aten::_local_scalar_dense` — what `.item()`, `bool(t)` and
`float(t)` run — and the CUDA runtime's synchronising calls), which backend sdpa ran each
attention call on (flash, memory-efficient, cuDNN or math: by the operator each runs, and their
kernels' device time by kernel name) and the graphs torch.compile built in the row (0 eager).

    scripts/gpu_check.sh                       # one GPU, under 4 minutes on an H100/H200
    scripts/gpu_check.sh --json gpu.json       # also write the figures as JSON
    scripts/gpu_check.sh --profile --json gpu.json   # plus the profile of transformer_big bf16
    python scripts/gpu_check.py --smoke        # tiny (equal) models on CPU in seconds: the script works
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import gc
import json
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from hydra import compose, initialize_config_dir

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mtrain.batches.corpus import EncodedCorpus
from mtrain.batches.prepare import PreparedData
from mtrain.cli.common import CONFIG_DIR
from mtrain.data.sources import ParallelText
from mtrain.runtime import resolve_device
from mtrain.tokenizer import SpecialIds
from mtrain.train.setup import setup_fit
from mtrain.train.throughput import model_flops_utilization, peak_flops

UNK, PAD, BOS, EOS = 0, 1, 2, 3
MODES = {"bf16": ("bf16", False), "bf16+compile": ("bf16", True), "fp32": ("fp32", False)}
TRACK_WINDOW = 10  # updates averaged at the end of the tracking runs


@dataclass
class Settings:
    models: list[str]
    modes: list[str]
    vocab: int
    sentences: int
    max_tokens: int
    updates: int
    warmup: int
    compile_warmup: int
    seconds: float
    track_updates: int
    tolerance: float
    budget: float
    compile_backend: str
    model_overrides: list[str] = field(default_factory=list)


def full_settings(args: argparse.Namespace) -> Settings:
    return Settings(
        models=args.models.split(","),
        modes=args.modes.split(","),
        vocab=32_768,
        sentences=60_000,
        max_tokens=args.max_tokens,
        updates=args.updates,
        warmup=5,
        compile_warmup=15,
        seconds=args.seconds,
        track_updates=args.track_updates,
        tolerance=args.tolerance,
        budget=args.budget,
        compile_backend="inductor",
    )


def smoke_settings(args: argparse.Namespace) -> Settings:
    """Tiny models and budgets: every code path of the full check, on a CPU, in seconds."""
    tiny = [
        "model.encoder_layers=1",
        "model.decoder_layers=1",
        "model.d_model=32",
        "model.heads=2",
        "model.ffn_dim=64",
        "model.dropout=0.0",
        "model.attention_impl=sdpa",  # a GPU's attention path: the profile has sdpa calls to sort
    ]
    return Settings(
        models=args.models.split(","),
        modes=args.modes.split(","),
        vocab=256,
        sentences=400,
        max_tokens=600,
        updates=3,
        warmup=1,
        compile_warmup=1,
        seconds=10.0,
        track_updates=min(args.track_updates, 12),
        tolerance=args.tolerance,
        budget=args.budget,
        compile_backend="eager",
        model_overrides=tiny,
    )


# ---------------------------------------------------------------------- data
def synthetic_data(settings: Settings, seed: int = 0) -> PreparedData:
    """A corpus of random sentences whose targets are a fixed permutation of the sources."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.rint(rng.lognormal(np.log(28.0), 0.45, settings.sentences)), 4, 120).astype(np.int64)
    words = rng.integers(EOS + 1, settings.vocab, int(lengths.sum()))
    permutation = np.concatenate([np.arange(EOS + 1), EOS + 1 + rng.permutation(settings.vocab - EOS - 1)])
    tgt_tokens = permutation[words]
    tgt_offsets = np.concatenate([[0], np.cumsum(lengths)])
    # Sources are the same words followed by eos (the encoded-corpus layout).
    src_offsets = np.concatenate([[0], np.cumsum(lengths + 1)])
    src_tokens = np.full(int(src_offsets[-1]), EOS, dtype=np.int64)
    src_tokens[np.arange(int(lengths.sum())) + np.repeat(np.arange(len(lengths)), lengths)] = words
    corpus = EncodedCorpus(src_tokens, src_offsets, tgt_tokens, tgt_offsets)
    # What the setup reads of a tokenizer: one joint vocabulary of `settings.vocab` pieces.
    vocabulary = SimpleNamespace(
        unk_id=UNK,
        pad_id=PAD,
        bos_id=BOS,
        eos_id=EOS,
        special_ids=SpecialIds(unk=UNK, pad=PAD, bos=BOS, eos=EOS),
        joint=True,
        src_vocab_size=settings.vocab,
        tgt_vocab_size=settings.vocab,
        fingerprint="synthetic",
    )
    return PreparedData(
        tokenizer=vocabulary,
        train=corpus,
        valid=corpus,
        test=corpus,  # type: ignore[arg-type]
        valid_text=ParallelText(),
        test_text=ParallelText(),
        directory=Path("."),
    )


# ---------------------------------------------------------------------- runs
@dataclass
class Run:
    model: str
    mode: str
    updates: int = 0
    seconds: float = 0.0
    warmup_seconds: float = 0.0
    tgt_tokens_per_s: float = 0.0
    src_tgt_tokens_per_s: float = 0.0
    mfu: float | None = None
    peak_memory_gib: float | None = None
    losses: list[float] = field(default_factory=list)
    first_update_seconds: float = 0.0  # with compile: the compile time (plus one update)
    recompiles: int | None = None  # graphs compiled in the whole row (compile rows)
    profile: dict | None = None
    skipped: str | None = None


def fit_config(model: str, settings: Settings, compiled: bool, extra: list[str]):
    overrides = [
        f"model={model}",
        *settings.model_overrides,
        f"train.max_tokens={settings.max_tokens}",
        "train.update_freq=1",
        f"train.compile={str(compiled).lower()}",
        *extra,
    ]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose(config_name="fit", overrides=overrides)


@contextlib.contextmanager
def compile_backend(backend: str):
    """The trainer calls torch.compile itself; smoke runs swap in a backend that compiles in
    seconds (dynamo tracing without code generation)."""
    if backend == "inductor":
        yield
        return
    original = torch.compile
    torch.compile = functools.partial(original, backend=backend)  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.compile = original  # type: ignore[assignment]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # the process's peak RSS


def train(
    model_name: str,
    mode: str,
    settings: Settings,
    data: PreparedData,
    device: torch.device,
    run_dir: Path,
    updates: int,
    warmup: int,
    seconds: float,
    extra: list[str] = (),
    profile_updates: int = 0,
) -> Run:
    """`warmup` untimed updates, then up to `updates` timed ones (or `seconds`), as `mtrain fit` runs them."""
    precision, compiled = MODES[mode]
    cfg = fit_config(model_name, settings, compiled, [f"train.device={device}", f"train.precision={precision}", *extra])
    with compile_backend(settings.compile_backend):
        setup = setup_fit(cfg, data=data)
    trainer, model = setup.trainer, setup.model
    run = Run(model_name, mode)
    losses, tgt, src, sentences = [], 0, 0, 0

    def update() -> dict:
        stats = trainer.run_update()
        losses.append(stats["loss_sum"] / stats["tgt_tokens"])  # a tensor: read once at the end
        return stats

    try:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        for index in range(warmup):
            update()
            if index == 0:
                synchronize(device)
                run.first_update_seconds = time.perf_counter() - start
        synchronize(device)
        run.warmup_seconds = time.perf_counter() - start
        start = time.perf_counter()
        while run.updates < updates and time.perf_counter() - start < seconds:
            stats = update()
            run.updates += 1
            tgt, src, sentences = tgt + stats["tgt_tokens"], src + stats["src_tokens"], sentences + stats["sentences"]
        synchronize(device)
        run.seconds = time.perf_counter() - start
        run.tgt_tokens_per_s = tgt / max(run.seconds, 1e-9)
        run.src_tgt_tokens_per_s = (tgt + src) / max(run.seconds, 1e-9)
        if sentences:
            flops = model.flops_per_token(max(1, round(src / sentences)), max(1, round(tgt / sentences)))
            run.mfu = model_flops_utilization(flops, run.tgt_tokens_per_s, peak_flops(device, precision))
        run.peak_memory_gib = peak_memory_gib(device)
        run.losses = [float(loss) for loss in losses]
        if compiled:
            run.recompiles = compiled_graphs()
        if profile_updates:
            run.profile = profile(update, device, profile_updates)
    finally:
        del model, setup  # `trainer` stays bound: update() closes over it
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return run


def compiled_graphs() -> int | None:
    """Graphs torch.compile built in this process (1 = no recompile), when dynamo says."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:  # pragma: no cover - dynamo missing
        return None
    return int(counters["stats"].get("unique_graphs", 0)) or None


SYNC_CALLS = (
    "aten::_local_scalar_dense",
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpy",
)  # cudaMemcpy (not ...Async) waits too


# sdpa's backends by the operator each runs (forward; torch.profiler's host-side events).
SDPA_OPERATORS = {
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash (CPU)",
    "aten::_scaled_dot_product_efficient_attention": "efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_attention_math": "math",
    "aten::_scaled_dot_product_fused_attention_overrideable": "overrideable",
}


def attention_kernel_backend(kernel: str) -> str | None:
    """The sdpa backend a CUDA kernel belongs to, by its name; None for other kernels. cuDNN's
    are `cudnn_generated_..._sdpa_..._flash_fprop...` (so cuDNN before flash); flash's
    `pytorch_flash::flash_fwd_kernel`/`flash_bwd_...`; memory-efficient attention's
    `fmha_cutlassF_...(PyTorchMemEffAttention::AttentionKernel...)`. Math has no kernel of its own
    (bmm, softmax)."""
    name = kernel.lower()
    if "cudnn" in name and ("sdpa" in name or "fmha" in name or "attn" in name or "flash" in name):
        return "cudnn"
    if "flash" in name:
        return "flash"
    if "fmha" in name or "memeff" in name or "attentionkernel" in name or "efficient_attention" in name:
        return "efficient"
    return None


def sdpa_backends(events, device_events, updates: int) -> dict:
    """Per backend: forward calls per update (operators) and device ms per update (kernels,
    forward and backward)."""
    calls: dict[str, float] = {}
    for event in events:
        backend = SDPA_OPERATORS.get(event.key)
        if backend is not None:
            calls[backend] = calls.get(backend, 0.0) + event.count / updates
    device_ms: dict[str, float] = {}
    for event in device_events:
        backend = attention_kernel_backend(event.key)
        if backend is not None:
            device_ms[backend] = device_ms.get(backend, 0.0) + event.self_device_time_total / 1e3 / updates
    return {"calls_per_update": calls, "device_ms_per_update": device_ms}


def profile(update, device: torch.device, updates: int, top: int = 12) -> dict:
    """torch.profiler over `updates` more updates: top kernels by device time (by CPU time
    on a CPU), device-busy share of the wall time, synchronisations per update."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    synchronize(device)
    with profiler(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(updates):
            update()
        synchronize(device)
        wall = time.perf_counter() - start
    events = prof.key_averages()
    syncs = sum(event.count for event in events if event.key in SYNC_CALLS)
    if device.type == "cuda":
        kernels = [event for event in events if event.self_device_time_total > 0]
        kernels.sort(key=lambda event: event.self_device_time_total, reverse=True)
        busy = sum(event.self_device_time_total for event in kernels) / 1e6  # microseconds -> s

        def time_of(event) -> float:
            return event.self_device_time_total / 1e3

    else:
        kernels = sorted(events, key=lambda event: event.self_cpu_time_total, reverse=True)
        busy = None  # no device: the CPU is the device, always busy

        def time_of(event) -> float:
            return event.self_cpu_time_total / 1e3

    total = sum(time_of(event) for event in kernels) or 1.0
    return {
        "updates": updates,
        "sdpa": sdpa_backends(events, kernels if device.type == "cuda" else [], updates),
        "compiled_graphs": compiled_graphs() or 0,
        "wall_ms_per_update": 1e3 * wall / updates,
        "device_busy_ms_per_update": None if busy is None else 1e3 * busy / updates,
        "device_busy_share": None if busy is None else busy / wall,
        "syncs_per_update": syncs / updates,
        "top": [
            {
                "name": event.key,
                "ms_per_update": time_of(event) / updates,
                "share": time_of(event) / total,
                "calls_per_update": event.count / updates,
            }
            for event in kernels[:top]
        ],
    }


def profile_report(run: Run) -> str:
    """The profile as Markdown: a summary line and a table of the top kernels."""
    prof = run.profile
    busy = (
        "n/a (CPU)"
        if prof["device_busy_share"] is None
        else f"{prof['device_busy_ms_per_update']:.1f} ms ({100 * prof['device_busy_share']:.0f}% of the wall time)"
    )
    lines = [
        f"\nprofile of {run.model} {run.mode}, {prof['updates']} updates: wall {prof['wall_ms_per_update']:.1f} "
        f"ms/update, device busy {busy}, "
        + (
            f"host-device syncs {prof['syncs_per_update']:.1f}/update\n"
            if prof["device_busy_share"] is not None
            else f"scalar reads {prof['syncs_per_update']:.1f}/update (a CPU waits for nothing: on a GPU these "
            "would be syncs, bar the fused optimizer's own)\n"
        ),
        sdpa_line(prof["sdpa"]) + f"; torch.compile graphs in this row: {prof['compiled_graphs']}\n",
        "| kernel / operator | ms/update | share | calls/update |",
        "|---|---:|---:|---:|",
    ]
    for row in prof["top"]:
        lines.append(
            f"| {row['name'][:70]} | {row['ms_per_update']:.2f} | {100 * row['share']:.1f}% | "
            f"{row['calls_per_update']:.0f} |"
        )
    return "\n".join(lines)


def sdpa_line(sdpa: dict) -> str:
    """Which backend sdpa ran the attention on, e.g. `sdpa: flash 12/update (1.9 ms), efficient 6/update (0.8 ms)`."""
    calls, device_ms = sdpa["calls_per_update"], sdpa["device_ms_per_update"]
    if not calls and not device_ms:
        return "sdpa: no call (attention_impl=math: matmul and softmax)"
    parts = []
    for backend in sorted(set(calls) | set(device_ms)):
        ms = f" ({device_ms[backend]:.2f} ms)" if backend in device_ms else ""
        parts.append(f"{backend} {calls.get(backend, 0):.0f}/update{ms}")
    return "sdpa: " + ", ".join(parts)


def tracking_check(settings: Settings, data: PreparedData, device: torch.device, run_dir: Path) -> dict:
    """fp32 and bf16 from the same weights on the same batches: do the loss curves agree?"""
    extra = [
        "model.dropout=0.0",
        "model.attention_dropout=0.0",
        "model.activation_dropout=0.0",
        "train.warmup_updates=10",
        "train.lr=5e-4",
    ]
    curves = {}
    for mode in ("fp32", "bf16"):
        run = train(
            settings.models[0], mode, settings, data, device, run_dir, settings.track_updates, 0, float("inf"), extra
        )
        curves[mode] = run.losses
    window = min(TRACK_WINDOW, settings.track_updates)
    final = {mode: float(np.mean(curve[-window:])) for mode, curve in curves.items()}
    gap = abs(final["bf16"] - final["fp32"]) / final["fp32"]
    return {
        "model": settings.models[0],
        "updates": settings.track_updates,
        "first_loss": curves["fp32"][0],
        "window": window,
        "final_fp32": final["fp32"],
        "final_bf16": final["bf16"],
        "relative_gap": gap,
        "tolerance": settings.tolerance,
        "passed": bool(gap <= settings.tolerance),
        "curves": curves,
    }


# ---------------------------------------------------------------------- report
def describe(device: torch.device) -> str:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        tf32 = torch.get_float32_matmul_precision() != "highest"
        fp32 = "TF32 allowed" if tf32 else "full FP32 (TF32 off; MFU against the TF32 peak)"
        return f"{name}, CUDA {torch.version.cuda}, torch {torch.__version__}, fp32 matmuls: {fp32}"
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads), torch {torch.__version__}"


def table_header(device: torch.device) -> str:
    memory = "peak GiB" if device.type == "cuda" else "peak RSS GiB"
    return (
        f"| model | mode | tgt tok/s | src+tgt tok/s | MFU | {memory} | timed updates | warm-up s "
        "| first update s (compile) | graphs | loss |\n"
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )


def table_row(run: Run) -> str:
    if run.skipped:
        return f"| {run.model} | {run.mode} | skipped: {run.skipped} | | | | | | | | |"
    mfu = f"{100 * run.mfu:.1f}%" if run.mfu is not None else "n/a"
    return (
        f"| {run.model} | {run.mode} | {run.tgt_tokens_per_s:,.0f} | {run.src_tgt_tokens_per_s:,.0f} | {mfu} | "
        f"{run.peak_memory_gib:.2f} | {run.updates} ({run.seconds:.1f} s) | {run.warmup_seconds:.1f} | "
        f"{run.first_update_seconds:.1f} | {run.recompiles if run.recompiles is not None else ''} | "
        f"{run.losses[-1]:.3f} |"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny models on any device (CPU is fine)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--models", default="transformer_base,transformer_big")
    parser.add_argument("--modes", default="bf16,fp32,bf16+compile")
    parser.add_argument("--max-tokens", type=int, default=16_384, help="train.max_tokens (tokens per batch)")
    parser.add_argument("--updates", type=int, default=300, help="timed updates per model and mode (at most)")
    parser.add_argument("--seconds", type=float, default=10.0, help="timed seconds per model and mode (at most)")
    parser.add_argument("--track-updates", type=int, default=100)
    parser.add_argument("--tolerance", type=float, default=0.02, help="bf16 vs fp32 final loss, relative")
    parser.add_argument(
        "--budget",
        type=float,
        default=230.0,
        help="seconds for the whole check: a row gets at most what is left, later rows are skipped",
    )
    parser.add_argument(
        "--row-timeout",
        type=float,
        default=45.0,
        help="seconds a row may take (compile rows: twice that), the tracking check 90",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="profile transformer_big bf16 (smoke: the first model): kernels, busy time, syncs",
    )
    parser.add_argument("--profile-updates", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # "track" or "MODEL:MODE[:profile]": one row, JSON out
    args = parser.parse_args(argv)
    for mode in args.modes.split(","):
        if mode not in MODES:
            parser.error(f"--modes: {mode!r} is not one of {', '.join(MODES)}")
    return args


def child(args: argparse.Namespace, settings: Settings, device: torch.device) -> int:
    """One row (or the tracking check) in this process; its result as the last stdout line."""
    data = synthetic_data(settings)
    run_dir = Path(tempfile.mkdtemp(prefix="mtrain-gpu-check-"))
    try:
        if args.child == "track":
            result = tracking_check(settings, data, device, run_dir)
        else:
            model_name, mode, *flags = args.child.split(":")
            warmup = settings.compile_warmup if MODES[mode][1] else settings.warmup
            run = train(
                model_name,
                mode,
                settings,
                data,
                device,
                run_dir,
                settings.updates,
                warmup,
                settings.seconds,
                profile_updates=args.profile_updates if "profile" in flags else 0,
            )
            result = asdict(run)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def in_child(argv: list[str], what: str, limit: float) -> tuple:
    """Run `what` in a child process with a time limit: (result dict or None, why not)."""
    command = [sys.executable, str(Path(__file__).resolve()), *argv, "--child", what]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {limit:.3g} s"
    results = [line[len("RESULT ") :] for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not results:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"failed (exit {done.returncode}): {last[:160]}"
    return json.loads(results[-1]), None


def child_argv(argv: list[str] | None) -> list[str]:
    """This invocation's options that a child needs (not --json, --profile or --child)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    kept, skip = [], False
    for item in argv:
        if skip:
            skip = False
            continue
        if item in ("--json", "--child"):
            skip = True
            continue
        if item == "--profile" or item.startswith(("--json=", "--child=")):
            continue
        kept.append(item)
    return kept


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.perf_counter()
    device = resolve_device(args.device)
    if device.type != "cuda" and not args.smoke:
        print(
            "gpu_check: no CUDA device here; run it on a GPU machine, or use --smoke to check the script",
            file=sys.stderr,
        )
        return 2
    settings = smoke_settings(args) if args.smoke else full_settings(args)
    if device.type == "cpu":
        torch.set_num_threads(1)  # tiny models: more threads only contend (and CPUs are often shared)
    if args.child:
        return child(args, settings, device)

    forwarded = child_argv(argv)
    data = synthetic_data(settings)
    date = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    print(f"# mtrain GPU check{' (smoke: tiny models)' if args.smoke else ''} | {date}")
    print(f"# {describe(device)}")
    print(
        f"# synthetic corpus: {settings.sentences:,} pairs, mean length {data.train.tgt_lengths.mean():.1f} "
        f"tokens, vocabulary {settings.vocab:,}; max_tokens {settings.max_tokens:,} per update; each row in "
        f"its own process, {args.row_timeout:.0f} s limit ({2 * args.row_timeout:.0f} s with compile)",
        flush=True,
    )
    track, why = in_child(forwarded, "track", 2 * args.row_timeout)
    if track is None:
        print(f"\nbf16 vs fp32: not measured: {why}\n", flush=True)
    else:
        verdict = "PASS" if track["passed"] else "FAIL"
        print(
            f"\nbf16 vs fp32 ({track['model']}, same init and batches, dropout off, {track['updates']} updates): "
            f"loss {track['first_loss']:.3f} -> fp32 {track['final_fp32']:.4f}, bf16 {track['final_bf16']:.4f} "
            f"(mean of the last {track['window']}); gap {100 * track['relative_gap']:.2f}% "
            f"<= {100 * track['tolerance']:.0f}%: {verdict}\n",
            flush=True,
        )

    # Rows are printed as they come, so a run cut short still leaves its figures.
    print(table_header(device), flush=True)
    profiled_model = settings.models[0] if args.smoke else "transformer_big"
    runs: list[Run] = []
    for model_name in settings.models:
        for mode in settings.modes:
            left = settings.budget - (time.perf_counter() - began)
            profiled = args.profile and model_name == profiled_model and mode == "bf16"
            limit = min(args.row_timeout * (2 if MODES[mode][1] else 1) + (30 if profiled else 0), left)
            if limit < min(args.row_timeout, 10.0):
                run = Run(model_name, mode, skipped=f"past the {settings.budget:.0f} s budget")
            else:
                what = f"{model_name}:{mode}" + (":profile" if profiled else "")
                result, why = in_child(forwarded, what, limit)
                run = Run(**result) if result is not None else Run(model_name, mode, skipped=why)
            runs.append(run)
            print(table_row(run), flush=True)
    for run in runs:
        if run.profile:
            print(profile_report(run), flush=True)
    print(f"\n# total {time.perf_counter() - began:.0f} s")
    if args.json:
        result = {
            "date": date,
            "device": describe(device),
            "smoke": args.smoke,
            "settings": asdict(settings),
            "tracking": track,
            "runs": [{**asdict(run), "losses": run.losses[-1:]} for run in runs],
        }
        args.json.write_text(json.dumps(result, indent=1), encoding="utf-8")
    return 0 if track is not None and track["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
