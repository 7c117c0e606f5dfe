"""Shape buckets: training batches padded to a few fixed shapes (`train.shape_buckets`).

A compiled update wants few tensor shapes: torch.compile specialises its graphs on what it
sees, and a CUDA graph is recorded once per shape and replayed after. Rounding lengths up
to a multiple (`train.pad_to_multiple`) bounds the lengths but not their combinations with
the sentence count and the other side's length; an epoch of Multi30k at 4k tokens a batch
still has a dozen shapes at 20% padding. Here every batch has one of at most `buckets` shapes:

- **Widths.** A sentence pair's width is max(src_len, tgt_len + 1). `bucket_widths` chooses
  `buckets` widths (multiples of `multiple`, the last covering the widest pair) that waste
  the fewest padded positions over the corpus's widths (an exact dynamic program over the
  width histogram), once per run. A batch pads *both* sides to its bucket's width, so its
  shape is (rows, width, width).
- **Rows.** A bucket's pairs are cut into the fewest batches the token budget allows
  (`max_tokens // width` rows at most) of equal size: ceil(pairs / batches) rows, the few
  batches one pair short filled with dummy rows (index -1: a source of one eos, a target of
  bos and no label), so a bucket has one row count.

For one corpus the shapes are the same every epoch (the pairs of a bucket are fixed; which
pairs share a batch is reshuffled); a mixture's draw or a subword-sampling copy can change a
bucket's pair count, hence its row count, from one epoch to the next. Padding never changes
the loss: padded source positions are masked, padded target positions and dummy rows carry
no label, and no operation mixes rows (`tests/test_buckets.py` compares losses and gradients).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np


def pair_widths(src_lengths: np.ndarray, tgt_lengths: np.ndarray) -> np.ndarray:
    """The width each pair needs: its source (eos included) or its decoder input [bos] y."""
    return np.maximum(np.asarray(src_lengths, dtype=np.int64), np.asarray(tgt_lengths, dtype=np.int64) + 1)


def bucket_widths(widths: np.ndarray, buckets: int, multiple: int = 1) -> np.ndarray:
    """At most `buckets` widths, ascending multiples of `multiple` whose last covers max(`widths`),
    that minimise the padding sum(bucket(w) - w) when each width w is padded to the smallest
    bucket width >= w."""
    if buckets < 1 or multiple < 1:
        raise ValueError(f"buckets and multiple must be positive, got {buckets} and {multiple}")
    widths = -(-np.asarray(widths, dtype=np.int64) // multiple) * multiple
    if len(widths) == 0:
        return np.asarray([multiple], dtype=np.int64)
    # Only widths that occur can be optimal boundaries: lowering a boundary to the widest
    # width below it that occurs pads every pair of its bucket less.
    candidates, counts = np.unique(widths, return_counts=True)
    if len(candidates) <= buckets:
        return candidates
    pairs = np.concatenate([[0], np.cumsum(counts)])  # pairs up to candidate i (exclusive)
    mass = np.concatenate([[0], np.cumsum(counts * candidates)])
    # cost[i, j]: padding of the candidates i..j padded to candidates[j] (i <= j)
    upper = np.arange(len(candidates))
    cost = candidates[None, :] * (pairs[None, 1:] - pairs[:, None][:-1]) - (mass[None, 1:] - mass[:, None][:-1])
    cost = np.where(upper[:, None] <= upper[None, :], cost, np.inf).astype(np.float64)
    best = cost[0].copy()  # best[j]: the least padding of candidates 0..j with one bucket ending at j
    choices = []
    for _ in range(buckets - 1):
        # a bucket (i+1..j] after the best split of 0..i
        total = best[:-1, None] + cost[1:, :]  # (i, j) for i in 0..n-2
        previous = np.argmin(total, axis=0)
        improved = total[previous, upper] < best
        choices.append(np.where(improved, previous, -1))
        best = np.where(improved, total[previous, upper], best)
    j = len(candidates) - 1
    chosen = [int(candidates[j])]
    for previous in reversed(choices):
        if previous[j] >= 0:  # else one more bucket did not help here: look one level down
            j = int(previous[j])
            chosen.append(int(candidates[j]))
    return np.asarray(sorted(chosen), dtype=np.int64)


def bucket_of(widths: np.ndarray, ladder: np.ndarray, multiple: int = 1) -> np.ndarray:
    """The padded width of each of `widths`: the smallest of `ladder` that holds it; past the
    ladder's last (a pair wider than any the ladder was made from) its own width rounded to
    `multiple`."""
    widths = np.asarray(widths, dtype=np.int64)
    position = np.searchsorted(ladder, widths)
    own = -(-widths // multiple) * multiple
    return np.where(position < len(ladder), ladder[np.minimum(position, len(ladder) - 1)], own)


def bucketed_batches(order: np.ndarray, padded: np.ndarray, max_tokens: int) -> list[np.ndarray]:
    """Batches of `order` (indices, grouped by their `padded` width in runs) under `max_tokens`:
    each run cut into the fewest equal batches, short ones filled with -1 (dummy rows)."""
    batches: list[np.ndarray] = []
    runs = np.flatnonzero(np.diff(padded[order])) + 1
    for run in np.split(order, runs):
        if len(run) == 0:
            continue
        width = int(padded[run[0]])
        capacity = max(1, max_tokens // width)
        count = -(-len(run) // capacity)
        rows = -(-len(run) // count)
        for part in np.array_split(run, count):
            batches.append(np.concatenate([part, np.full(rows - len(part), -1, dtype=np.int64)]))
    return batches


def batch_shapes(
    batches: Sequence[np.ndarray],
    src_lengths: np.ndarray,
    tgt_lengths: np.ndarray,
    multiple: int = 1,
    ladder: np.ndarray | None = None,
) -> tuple[Counter[tuple[int, int, int]], float]:
    """The (rows, src_len, tgt_len) tensor shapes `collate` makes of `batches` (how many of
    each), and the share of padding in their positions (src + tgt, dummy rows included)."""
    shapes: Counter[tuple[int, int, int]] = Counter()
    real = padded = 0
    for batch in batches:
        pairs = batch[batch >= 0]
        src, tgt = src_lengths[pairs], tgt_lengths[pairs] + 1
        if ladder is not None:
            src_len = tgt_len = int(bucket_of(np.asarray([max(src.max(), tgt.max())]), ladder, multiple)[0])
        else:
            src_len = -(-int(src.max()) // multiple) * multiple
            tgt_len = -(-int(tgt.max()) // multiple) * multiple
        shapes[(len(batch), src_len, tgt_len)] += 1
        real += int(src.sum() + tgt.sum())
        padded += len(batch) * (src_len + tgt_len)
    return shapes, (1.0 - real / padded) if padded else 0.0
