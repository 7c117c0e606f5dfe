#!/usr/bin/env python
"""Fine-tuning an imported NLLB-shaped model with its full vocabulary and trimmed (`init_vocab=corpus`).

    python scripts/bench_vocab_trim.py --work /tmp/bench_trim                 # the test fixtures' size
    python scripts/bench_vocab_trim.py --work /tmp/bench_trim_600m --nllb-600m --updates 3 --warmup 1

1. Builds (once, in --work) an NLLB-200-shaped M2M100ForConditionalGeneration with random
   weights (tests/m2m100_dirs.py): by default the tests' small one (d 32, 2+2 layers, a
   400-piece SentencePiece model of Multi30k: 604 rows); with --nllb-600m NLLB-200-distilled-
   600M's shape (d 1024, 12+12 layers, 16 heads, FFN 4096, 256,206 rows), its SentencePiece
   model filled to 256,000 pieces with pieces of private-use characters no text holds (the
   tokenizer files are sentencepiece.bpe.model and tokenizer_config.json: no tokenizer.json);
   --layers sets fewer layers per stack where memory is short (the vocabulary's rows, what
   trimming removes, cost the same at any depth).
2. In fresh processes, alternately, full and trimmed: `init_from=` the directory with the
   Multi30k de-en training slice (--train-limit pairs), then --warmup updates and --updates
   timed ones; target tokens/s, the model's parameters, and the process's peak RSS (VmHWM).
3. With --transformers, a third arm in its own process: a plain transformers training loop
   (`M2M100ForConditionalGeneration.from_pretrained`, `torch.optim.AdamW` at train.lr, labels
   with pad as -100) over the very batches mtrain's full-vocabulary run trains on (its batch
   source, same order and token budget), fp32, the same threads.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

NLLB_600M = dict(d_model=1024, layers=12, heads=16, ffn_dim=4096)
NLLB_PIECES = 256_000  # sentencepiece.bpe.model's pieces in the published model (+4 specials, 202 codes)


def build(directory: Path, data_dir: Path, big: bool, layers: int) -> None:
    from sentencepiece import sentencepiece_model_pb2

    from tests.m2m100_dirs import build_nllb_dir, train_fairseq_spm

    if (directory / "config.json").is_file():
        return
    spm_model = train_fairseq_spm(directory.parent / "spm", data_dir)
    if big:  # filled with pieces no Multi30k text segments into
        proto = sentencepiece_model_pb2.ModelProto()
        proto.ParseFromString(spm_model.read_bytes())
        for index in range(NLLB_PIECES - len(proto.pieces)):
            piece = proto.pieces.add()
            piece.piece = chr(0xF0000 + index // 4096) + chr(0xE000 + index % 4096)
            piece.score = -1e6 - index
        spm_model.write_bytes(proto.SerializeToString())
    build_nllb_dir(directory, spm_model, **(dict(NLLB_600M, layers=layers) if big else {}))
    if big:  # NllbTokenizer's tokenizer.json of 256k pieces is not what is measured: the codes are in the config
        (directory / "tokenizer.json").unlink()


def one(directory: Path, work: Path, vocab: str, threads: int, updates: int, warmup: int, max_tokens: int,
        train_limit: int) -> dict:  # fmt: skip
    from hydra import compose, initialize_config_dir

    from mtrain.cli.common import CONFIG_DIR
    from mtrain.config import with_resolved_model
    from mtrain.train.init_from import inherited_config, load_parent
    from mtrain.train.setup import build_fit, prepare_fit_data, resolve_machine

    overrides = [
        f"init_from={directory}",
        f"init_vocab={'full' if vocab == 'transformers' else vocab}",  # (transformers: the full run's batches)
        f"data.cache_dir={work / 'cache'}",
        f"data.train_limit={train_limit}",
        "data.splits.test=null",
        f"train.max_tokens={max_tokens}",
        f"train.num_threads={threads}",
        "train.log_every=1000000",
        "train.precision=fp32",
    ]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = with_resolved_model(compose(config_name="fit", overrides=overrides))
    start = time.perf_counter()
    parent = load_parent(str(directory), "auto", False, cfg.data, "full" if vocab == "transformers" else vocab)
    cfg = inherited_config(cfg, parent.config, [], f"init_from={directory}")
    machine = resolve_machine(cfg)
    data = prepare_fit_data(cfg, machine, tokenizer=parent.tokenizer)
    fit = build_fit(cfg, machine, data, init=parent)
    del parent
    import_seconds = time.perf_counter() - start
    trainer = fit.trainer
    if vocab == "transformers":
        return plain_transformers_loop(directory, trainer, cfg.train.lr, updates, warmup, import_seconds)
    for _ in range(warmup):
        trainer.run_update()
    tokens, start = 0, time.perf_counter()
    for _ in range(updates):
        stats = trainer.run_update()
        tokens += stats["tgt_tokens"] if stats else 0
    seconds = time.perf_counter() - start
    peak = int(next(line for line in open("/proc/self/status") if line.startswith("VmHWM:")).split()[1]) / 1024
    model = trainer.model
    return dict(
        vocab=vocab,
        rows=data.tokenizer.src_vocab_size if hasattr(data, "tokenizer") else None,
        parameters=sum(p.numel() for p in model.parameters()),
        tokens_per_second=tokens / seconds,
        seconds_per_update=seconds / updates,
        import_and_setup_seconds=import_seconds,
        peak_rss_mb=peak,
    )


def plain_transformers_loop(
    directory: Path, trainer: Any, lr: float, updates: int, warmup: int, setup_s: float
) -> dict:
    """transformers' own model and AdamW over the batches of mtrain's full-vocabulary run (the
    batch source's next updates: the same sentences, padding and token budget)."""
    import torch
    from transformers import M2M100ForConditionalGeneration

    model = M2M100ForConditionalGeneration.from_pretrained(directory, torch_dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), eps=1e-8)

    def update() -> int:
        batches = trainer.parts.batches.next_update(trainer.state)
        tokens = 0
        optimizer.zero_grad(set_to_none=True)
        for batch in batches:
            labels = batch.tgt_output.masked_fill(batch.tgt_output == model.config.pad_token_id, -100)
            out = model(
                input_ids=batch.src_tokens,
                attention_mask=(~batch.src_padding_mask).long(),
                decoder_input_ids=batch.tgt_input,
                labels=labels,
            )
            out.loss.backward()
            tokens += batch.num_tgt_tokens
        optimizer.step()
        return tokens

    for _ in range(warmup):
        update()
    tokens, start = 0, time.perf_counter()
    for _ in range(updates):
        tokens += update()
    seconds = time.perf_counter() - start
    peak = int(next(line for line in open("/proc/self/status") if line.startswith("VmHWM:")).split()[1]) / 1024
    return dict(
        vocab="transformers",
        rows=model.config.vocab_size,
        parameters=sum(p.numel() for p in model.parameters()),
        tokens_per_second=tokens / seconds,
        seconds_per_update=seconds / updates,
        import_and_setup_seconds=setup_s,
        peak_rss_mb=peak,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench_vocab_trim"))
    parser.add_argument("--data-dir", type=Path, default=Path(os.environ.get("MTRAIN_DATA_DIR", "../shared/data")))
    parser.add_argument("--nllb-600m", action="store_true")
    parser.add_argument("--layers", type=int, default=12, help="with --nllb-600m: layers per stack")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--updates", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=2048)
    parser.add_argument("--train-limit", type=int, default=5000)
    parser.add_argument("--transformers", action="store_true", help="also a plain transformers loop, same batches")
    parser.add_argument("--one", choices=["full", "corpus", "transformers"], help=argparse.SUPPRESS)  # a child's run
    args = parser.parse_args()
    directory = args.work / (f"nllb-600m-shape-{args.layers}-layers" if args.nllb_600m else "nllb-small")
    if args.one:
        result = one(directory, args.work, args.one, args.threads, args.updates, args.warmup, args.max_tokens,
                     args.train_limit)  # fmt: skip
        print(json.dumps(result))
        return
    build(directory, args.data_dir, args.nllb_600m, args.layers)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), HF_HUB_OFFLINE="1", MTRAIN_DATA_DIR=str(args.data_dir))
    results: dict[str, list[dict]] = {"full": [], "corpus": []}
    if args.transformers:
        results["transformers"] = []
    for _ in range(args.rounds):
        for vocab in results:
            command = [sys.executable, "-W", "ignore", __file__, "--one", vocab, *sys.argv[1:]]
            done = subprocess.run(command, env=env, capture_output=True, text=True)
            if done.returncode:
                sys.exit(f"{vocab}: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}")
            results[vocab].append(json.loads(done.stdout.strip().splitlines()[-1]))
    for vocab, runs in results.items():
        speeds = " ".join(f"{run['tokens_per_second']:.0f}" for run in runs)
        run = runs[-1]
        print(
            f"{vocab:12s}: {run['parameters'] / 1e6:.2f}M parameters | {speeds} target tokens/s | "
            f"{run['seconds_per_update']:.2f} s/update | peak RSS {max(r['peak_rss_mb'] for r in runs):.0f} MB | "
            f"import + data {run['import_and_setup_seconds']:.1f} s"
        )
    ratio = sum(r["tokens_per_second"] for r in results["corpus"]) / sum(
        r["tokens_per_second"] for r in results["full"]
    )
    print(f"trimmed / full tokens/s: {ratio:.2f}")
    if args.transformers:
        against = sum(r["tokens_per_second"] for r in results["full"]) / sum(
            r["tokens_per_second"] for r in results["transformers"]
        )
        print(f"mtrain full / transformers tokens/s (same batches): {against:.2f}")


if __name__ == "__main__":
    main()
