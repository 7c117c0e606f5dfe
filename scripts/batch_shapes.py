#!/usr/bin/env python
"""Distinct training-batch shapes (rows, src_len, tgt_len) in one epoch of a config.

Each new shape costs torch.compile a graph (or a recompile), CUDA graphs a recording and the
CPU allocator a new set of block sizes; `train.pad_to_multiple` bounds their number, shape
buckets (`train.shape_buckets`) fix it. Also prints the share of padding in the batches (what
the rounding costs in FLOPs; dummy rows included), the mean fill of the token budget, and the
share of batches without source padding (their attention runs unmasked: flash-eligible on CUDA).

    python scripts/batch_shapes.py experiment=multi30k_cpu --multiples 1,8
    python scripts/batch_shapes.py experiment=multi30k_gpu --multiples 1,8 --buckets 4,8 --max-tokens 4096,16384
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from hydra import compose, initialize_config_dir

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mtrain.batches import prepare_data
from mtrain.batches.batching import TokenBatchSampler
from mtrain.batches.buckets import batch_shapes, bucket_of, bucket_widths, pair_widths
from mtrain.cli.common import CONFIG_DIR


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the fit config")
    parser.add_argument("--multiples", default="1,8", help="comma-separated train.pad_to_multiple values")
    parser.add_argument("--buckets", default="", help="comma-separated train.shape_buckets values (multiple 1)")
    parser.add_argument("--max-tokens", default=None, help="comma-separated budgets (default: the config's)")
    parser.add_argument("--epoch", type=int, default=1)
    args = parser.parse_args()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="fit", overrides=args.overrides)
    train = prepare_data(cfg.data, cfg.tokenizer, log=lambda *a: None).train
    src, tgt = train.src_lengths, train.tgt_lengths
    budgets = [int(b) for b in args.max_tokens.split(",")] if args.max_tokens else [cfg.train.max_tokens]
    variants = [("pad_to_multiple", int(m)) for m in args.multiples.split(",") if m]
    variants += [("shape_buckets", int(k)) for k in args.buckets.split(",") if k]
    print(
        f"{'max_tokens':>10} {'padding by':>16} {'value':>5} {'batches':>8} {'shapes':>7} {'padding':>8} {'fill':>6} "
        f"{'unpadded src':>12}"
    )
    for max_tokens in budgets:
        for kind, value in variants:
            ladder = bucket_widths(pair_widths(src, tgt), value) if kind == "shape_buckets" else None
            multiple = value if kind == "pad_to_multiple" else 1
            sampler = TokenBatchSampler(src, tgt, max_tokens, cfg.seed, pad_to_multiple=multiple, bucket_widths=ladder)
            batches = sampler.batches(args.epoch)
            shapes, padding = batch_shapes(batches, src, tgt, multiple, ladder)
            fill = np.mean([rows * max(s, t) / max_tokens for (rows, s, t), n in shapes.items() for _ in range(n)])
            unpadded = np.mean([_source_unpadded(batch, src, tgt, multiple, ladder) for batch in batches])
            print(
                f"{max_tokens:>10} {kind:>16} {value:>5} {len(batches):>8} {len(shapes):>7} "
                f"{padding:>8.1%} {fill:>6.2f} {unpadded:>12.1%}"
            )


def _source_unpadded(batch: np.ndarray, src: np.ndarray, tgt: np.ndarray, multiple: int, ladder) -> bool:
    """Whether every source of the batch fills its padded width, as `collate` pads it (no dummy
    row either): such a batch's attention runs without a mask (Batch.src_padding_mask_or_none)."""
    if (batch < 0).any():
        return False
    lengths = src[batch]
    width = -(-int(lengths.max()) // multiple) * multiple
    if ladder is not None:
        widest = max(width, int(tgt[batch].max()) + 1)
        width = int(bucket_of(np.asarray([widest]), ladder)[0])
    return bool((lengths == width).all())


if __name__ == "__main__":
    main()
