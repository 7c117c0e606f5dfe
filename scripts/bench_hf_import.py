#!/usr/bin/env python
"""Reading an OPUS-MT-sized MarianMTModel, and fine-tuning it, beside transformers and a native run.

    python scripts/bench_hf_import.py --work /tmp/bench_hf --updates 12 --rounds 2

1. Builds (once, in --work) a MarianMTModel of OPUS-MT's size with random weights: 6+6 layers,
   d_model 512, 8 heads, FFN 2048, one vocabulary of 58,101 pieces (tests/marian_dirs.py; the
   SentencePiece models are small, the table is filled to that size).
2. Import: in fresh processes, alternately, mtrain's read of the directory (`read_hf_model`,
   `build_model`, `load_state_dict`: what `init_from=` does before training) and transformers'
   `MarianMTModel.from_pretrained`, each until every weight has been read once; wall time, and
   the RSS after the imports, at its peak and at the end.
3. Fine-tuning: target tokens/s of training updates of the imported model (`init_from=`) and of
   a native mtrain model of the same size (pre-LN, ReLU, no output bias, fairseq's sinusoids)
   over the same vocabulary (`tokenizer.path=` the directory) and the same Multi30k batches,
   in interleaved rounds in one process, so the ratio holds on a loaded machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hydra import compose, initialize_config_dir

from mtrain.cli.common import CONFIG_DIR
from mtrain.config import with_resolved_model
from mtrain.train.init_from import inherited_config, load_parent
from mtrain.train.setup import build_fit, prepare_fit_data, resolve_machine

OPUS_MT = dict(d_model=512, layers=6, heads=8, ffn_dim=2048, table_size=58101, max_positions=512)
NATIVE = ["model.layers=6", "model.d_model=512", "model.heads=8", "model.ffn_dim=2048", "model.max_positions=512"]

READ_MTRAIN = """
import json, sys, time
from pathlib import Path
sys.path.insert(0, {root!r})
import torch
from mtrain.model import build_model
from mtrain.train.hf_parent import read_hf_model
def status(key):
    return int(next(l for l in open("/proc/self/status") if l.startswith(key)).split()[1]) / 1024
before = status("VmRSS:")
start = time.perf_counter()
imported = read_hf_model(Path({directory!r}), "bench")
tokenizer = imported.tokenizer
model = build_model(imported.model, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, tokenizer.pad_id,
                    joint_vocab=tokenizer.joint)
model.load_state_dict(imported.state_dict, strict=True)
del imported
touched = sum(float(p.sum()) for p in model.parameters())  # every weight resident, as after a forward pass
seconds = time.perf_counter() - start
print(json.dumps(dict(seconds=seconds, before_mb=before, peak_mb=status("VmHWM:"), end_mb=status("VmRSS:"))))
"""
READ_TRANSFORMERS = """
import json, time
import torch
from transformers import MarianMTModel, MarianTokenizer
def status(key):
    return int(next(l for l in open("/proc/self/status") if l.startswith(key)).split()[1]) / 1024
before = status("VmRSS:")
start = time.perf_counter()
model = MarianMTModel.from_pretrained({directory!r})
tokenizer = MarianTokenizer.from_pretrained({directory!r})
touched = sum(float(p.sum()) for p in model.parameters())  # the memory-mapped weights read in
seconds = time.perf_counter() - start
print(json.dumps(dict(seconds=seconds, before_mb=before, peak_mb=status("VmHWM:"), end_mb=status("VmRSS:"))))
"""


def build(directory: Path, data_dir: Path) -> None:
    from tests.marian_dirs import build_marian_dir

    if not (directory / "config.json").is_file():
        build_marian_dir(directory, data_dir, weight_std=0.02, eos_bias=0.0, **OPUS_MT)


def read_in_fresh_process(code: str, directory: Path, threads: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    root = str(Path(__file__).resolve().parents[1])
    result = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code.format(root=root, directory=str(directory))],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def trainers(directory: Path, work: Path, threads: int, max_tokens: int):
    """(the imported model's trainer, the native model's), on the same data."""
    common = [
        f"data.cache_dir={work / 'cache'}",
        "data.train_limit=3000",
        "data.splits.test=null",
        f"train.max_tokens={max_tokens}",
        f"train.num_threads={threads}",
        "train.log_every=1000000",
    ]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        imported_cfg = with_resolved_model(compose(config_name="fit", overrides=[f"init_from={directory}", *common]))
        native_cfg = with_resolved_model(
            compose(config_name="fit", overrides=[f"tokenizer.path={directory}", *NATIVE, *common])
        )
    parent = load_parent(str(directory), "auto", False, imported_cfg.data)
    imported_cfg = inherited_config(imported_cfg, parent.config, [], f"init_from={directory}")
    out = []
    for cfg, init in ((imported_cfg, parent), (native_cfg, None)):
        machine = resolve_machine(cfg)
        data = prepare_fit_data(cfg, machine, tokenizer=parent.tokenizer)
        out.append(build_fit(cfg, machine, data, init=init).trainer)
    return out


def tokens_per_second(trainer, updates: int, warmup: int) -> float:
    for _ in range(warmup):
        trainer.run_update()
    tokens, start = 0, time.perf_counter()
    for _ in range(updates):
        stats = trainer.run_update()
        tokens += stats["tgt_tokens"] if stats else 0
    return tokens / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench_hf_import"))
    parser.add_argument("--data-dir", type=Path, default=Path(os.environ.get("MTRAIN_DATA_DIR", "../shared/data")))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--reads", type=int, default=2)
    parser.add_argument("--updates", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=2048)
    args = parser.parse_args()
    directory = args.work / "opus-mt-size"
    build(directory, args.data_dir)
    size = sum(path.stat().st_size for path in directory.iterdir()) / 2**20
    print(f"model directory {directory}: {size:.0f} MB")

    reads: dict[str, list[dict]] = {"mtrain": [], "transformers": []}
    for _ in range(args.reads):
        reads["mtrain"].append(read_in_fresh_process(READ_MTRAIN, directory, args.threads))
        reads["transformers"].append(read_in_fresh_process(READ_TRANSFORMERS, directory, args.threads))
    for name, runs in reads.items():
        best = min(runs, key=lambda run: run["seconds"])
        print(
            f"read {name:12s}: {best['seconds']:.2f} s (best of {len(runs)}); RSS after the imports "
            f"{best['before_mb']:.0f} MB, peak {best['peak_mb']:.0f} MB, at the end {best['end_mb']:.0f} MB"
        )

    if args.rounds == 0:
        return
    imported, native = trainers(directory, args.work, args.threads, args.max_tokens)
    speeds: dict[str, list[float]] = {"imported": [], "native": []}
    for _ in range(args.rounds):
        speeds["imported"].append(tokens_per_second(imported, args.updates, args.warmup))
        speeds["native"].append(tokens_per_second(native, args.updates, args.warmup))
    for name, values in speeds.items():
        print(f"fine-tune {name:8s}: {' '.join(f'{v:.0f}' for v in values)} target tokens/s")
    ratio = sum(speeds["imported"]) / sum(speeds["native"])
    print(f"imported / native: {ratio:.2f}")


if __name__ == "__main__":
    main()
