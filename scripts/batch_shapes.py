#!/usr/bin/env python
"""Distinct training-batch shapes (sentences, src_len, tgt_len) in one epoch of a config.

Each new shape costs torch.compile a graph (or a recompile) and the CPU allocator a new set
of block sizes; `train.pad_to_multiple` bounds their number. Also prints the share of
padding in the batches (what the rounding costs in FLOPs).

    python scripts/batch_shapes.py experiment=multi30k_cpu --multiples 1,8
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mtrain.batches import prepare_data
from mtrain.batches.batching import TokenBatchSampler, round_up
from mtrain.cli.common import CONFIG_DIR


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the fit config")
    parser.add_argument("--multiples", default="1,8", help="comma-separated train.pad_to_multiple values")
    parser.add_argument("--epoch", type=int, default=1)
    args = parser.parse_args()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="fit", overrides=args.overrides)
    train = prepare_data(cfg.data, cfg.tokenizer, log=lambda *a: None).train
    real = int(train.src_lengths.sum() + train.tgt_lengths.sum() + len(train.tgt_lengths))
    print(f"{'multiple':>8} {'batches':>8} {'shapes':>7} {'padding':>8}")
    for multiple in (int(m) for m in args.multiples.split(",")):
        sampler = TokenBatchSampler(
            train.src_lengths, train.tgt_lengths, cfg.train.max_tokens, cfg.seed, pad_to_multiple=multiple
        )
        shapes, padded = set(), 0
        for batch in sampler.batches(args.epoch):
            src_len = round_up(int(train.src_lengths[batch].max()), multiple)
            tgt_len = round_up(int(train.tgt_lengths[batch].max()) + 1, multiple)
            shapes.add((len(batch), src_len, tgt_len))
            padded += len(batch) * (src_len + tgt_len)
        print(f"{multiple:>8} {len(sampler.batches(args.epoch)):>8} {len(shapes):>7} {1 - real / padded:>8.1%}")


if __name__ == "__main__":
    main()
