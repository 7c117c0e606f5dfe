"""Train–test overlap: training pairs whose source side (or whole pair) is also in the
validation or test split of the same direction.

Everything is compared by 64-bit hashes of the (normalised, trimmed) text, never as strings:
the encoded training corpus stores the hashes of its kept pairs (8 bytes each, memory-mapped),
so counting against a new validation or test split is one `np.isin` over those arrays and
needs neither the training text nor a re-encoding. With `data.clean.drop_eval_overlap=true`
the encoding workers drop the pairs whose source is in valid or test (filter reason
`eval_overlap`); only then do the evaluation sets' hashes enter the training cache key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from mtrain.data.cleaning import pair_hashes


def text_hashes(texts: Sequence[str]) -> np.ndarray:
    """64-bit hashes of single sentences (the source side of pairs)."""
    return np.array(
        [int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little") for text in texts],
        dtype=np.uint64,
    )


@dataclass
class EvalHashes:
    """The sorted, distinct hashes of an evaluation split's sources and pairs."""

    sources: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint64))
    pairs: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint64))

    @classmethod
    def of(cls, src_texts: Sequence[str], tgt_texts: Sequence[str]) -> EvalHashes:
        return cls(np.unique(text_hashes(src_texts)), np.unique(pair_hashes(src_texts, tgt_texts)))

    def union(self, other: EvalHashes) -> EvalHashes:
        return EvalHashes(np.union1d(self.sources, other.sources), np.union1d(self.pairs, other.pairs))

    def digest(self) -> str:
        """Identifies the sets (a cache key when training pairs are dropped by them)."""
        return hashlib.sha256(self.sources.tobytes() + b"|" + self.pairs.tobytes()).hexdigest()


def count_overlap(
    train_sources: np.ndarray, train_pairs: np.ndarray, splits: dict[str, EvalHashes]
) -> dict[str, dict[str, int]]:
    """{split: {"source": n, "pair": m}} for each evaluation split and "any" (valid or test):
    how many training pairs have their source side, and their whole pair, in that split."""
    counts: dict[str, dict[str, int]] = {}
    masks: list[np.ndarray] = []
    pair_masks: list[np.ndarray] = []
    for split, hashes in splits.items():
        source_in = np.isin(train_sources, hashes.sources)
        pair_in = np.isin(train_pairs, hashes.pairs)
        counts[split] = {"source": int(source_in.sum()), "pair": int(pair_in.sum())}
        masks.append(source_in)
        pair_masks.append(pair_in)
    counts["any"] = {
        "source": int(np.logical_or.reduce(masks).sum()) if masks else 0,
        "pair": int(np.logical_or.reduce(pair_masks).sum()) if pair_masks else 0,
    }
    return counts
