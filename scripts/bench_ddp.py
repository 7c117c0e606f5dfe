#!/usr/bin/env python
"""Two-process gloo DDP training throughput of this checkout against another revision, side by side.

Each round trains the same config for the same training seconds (`train.max_train_time`) under
`torchrun --nproc_per_node=2` once with the revision's code (`git archive`d into a temporary
directory) and once with this checkout's, alternately, so that both see the machine as it is;
prints target tokens/s of each run (the mean of its training lines after the first, which
times the first update alone) and the median per tree.

    MTRAIN_DATA_DIR=/work/shared/data python scripts/bench_ddp.py --against 9054132 --seconds 40 --rounds 2
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Multi30k with a small model (about 0.1 s per update and rank on one thread), where what an
# update exchanges besides its gradients is a visible share of its time; overrides change it.
CONFIG = [
    "experiment=multi30k_cpu",
    "model.encoder_layers=2",
    "model.decoder_layers=2",
    "model.d_model=64",
    "model.heads=2",
    "model.ffn_dim=128",
    "tokenizer.vocab_size=2000",
    "train.max_tokens=1024",
    "data.train_limit=8000",
    "train.valid_bleu=false",
    "data.splits.test=null",
    "train.precision=fp32",
    "train.device=cpu",
    "train.num_threads=1",
    "train.validate_every=100000",
    "train.save_every=null",
    "train.log_every=10",
]
TOKENS_PER_S = re.compile(r"\| update (\d+).*\| tgt tok/s (\d+)")


def tokens_per_second(log_text: str) -> float:
    """The mean tgt tok/s of the training lines after the first."""
    rates = [float(match.group(2)) for match in TOKENS_PER_S.finditer(log_text) if int(match.group(1)) > 1]
    return statistics.fmean(rates) if rates else float("nan")


def train(tree: Path, run_dir: Path, cache: Path, seconds: int, overrides: list[str]) -> float:
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "mtrain"]
    command += [
        "fit",
        *CONFIG,
        *overrides,
        f"train.max_train_time={seconds}s",
        f"data.cache_dir={cache}",
        f"hydra.run.dir={run_dir}",
    ]
    result = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=seconds * 6 + 300)
    if result.returncode != 0:
        sys.exit(f"bench_ddp: {tree} failed: {result.stderr.strip().splitlines()[-1:]}")
    return tokens_per_second((run_dir / "train.log").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", required=True, help="the revision to compare with (e.g. main)")
    parser.add_argument("--seconds", type=int, default=40, help="training seconds of each run")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("overrides", nargs="*", help="config overrides for both")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_ddp_") as scratch:
        before = Path(scratch) / "before"
        before.mkdir()
        archive = subprocess.run(["git", "archive", args.against], cwd=REPO, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(before)], input=archive.stdout, check=True)
        trees = {f"before ({args.against})": before, "after (this checkout)": REPO}
        rates: dict[str, list[float]] = {name: [] for name in trees}
        for round_index in range(args.rounds):
            for name, tree in trees.items():
                run_dir = Path(scratch) / f"run-{round_index}-{len(rates[name])}-{tree.name}"
                rate = train(tree, run_dir, Path(scratch) / "cache", args.seconds, args.overrides)
                rates[name].append(rate)
                print(f"round {round_index + 1} {name}: {rate:.0f} tgt tok/s", flush=True)
        for name, values in rates.items():
            print(
                f"{name}: median {statistics.median(values):.0f} tgt tok/s over {len(values)} runs of {args.seconds} s"
            )


if __name__ == "__main__":
    main()
