"""Training on several corpora at once: each a `CorpusPart` with a weight, drawn anew each epoch.

Corpus i gets the share `weight_i * size_i^(1/T)` (normalised) of every epoch, T being
`data.sampling_temperature` (fairseq's `--sampling-temperature`): T = 1 draws by size (and
with all weights 1 is the plain concatenation, every pair once an epoch), a large T draws the
corpora equally, whatever their sizes, and the weights then act as ratios between them.

An epoch holds as many pairs as all corpora together. Corpus i contributes its share of
them: all of its pairs `floor(k)` times and a random subset (without replacement) for the
fraction of k = pairs drawn / its size, so a small corpus is repeated and a large one
subsampled, and within a pass no pair comes twice. The subset is drawn from a generator
seeded by (seed, epoch, i) alone: any epoch's draw is reproducible without replaying the
epochs before it, every DDP rank draws the same, and a resumed run continues bit-identically.

The corpora are not copied into one: `ConcatenatedCorpus` numbers their pairs one after the
other (lengths concatenated, a few bytes a pair) and `collate` reads each batch's pairs from
each part's own memory-mapped token arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from mtrain.batches.corpus import EncodedCorpus

if TYPE_CHECKING:
    from mtrain.batches.batching import TokenBatchSampler


@dataclass(frozen=True)
class CorpusPart:
    """One training corpus as prepared: its label (data.corpora[i].name, or data.name), its
    direction, the encoded training pairs (tags already at the start of each source), its
    weight and tag (CorpusConfig)."""

    name: str
    src: str
    tgt: str
    corpus: EncodedCorpus
    weight: float = 1.0
    tag: str | None = None


def corpus_shares(
    sizes: Sequence[int] | np.ndarray, weights: Sequence[float] | np.ndarray, temperature: float
) -> np.ndarray:
    """Each corpus's share of an epoch, summing to 1: proportional to weight * size^(1/temperature)."""
    sizes = np.asarray(sizes, dtype=np.float64)
    weights = np.asarray(weights, dtype=np.float64)
    if not temperature > 0:
        raise ValueError(f"the sampling temperature must be > 0, got {temperature}")
    if len(sizes) != len(weights) or (weights < 0).any() or not np.isfinite(weights).all():
        raise ValueError(f"need one finite weight >= 0 per corpus, got {list(weights)} for {len(sizes)} corpora")
    mass = weights * sizes ** (1.0 / temperature)  # an empty corpus gets nothing, whatever its weight
    if not mass.sum() > 0:
        raise ValueError("no corpus can be drawn from: every one is empty or weighs 0")
    return mass / float(mass.sum())


def draw_counts(shares: np.ndarray, total: int) -> np.ndarray:
    """Pairs per corpus in an epoch of `total`: round(share * total), by largest remainders so
    that they add up to `total` exactly (T = 1 and equal weights: each corpus's own size)."""
    exact = np.asarray(shares, dtype=np.float64) * total
    counts = np.floor(exact).astype(np.int64)
    short = max(int(total - counts.sum()), 0)
    counts[np.argsort(counts - exact, kind="stable")[:short]] += 1  # largest remainders first
    return counts


def draw_corpus(size: int, count: int, rng: np.random.Generator) -> np.ndarray:
    """`count` local indices of a corpus of `size` pairs: every pair count // size times, then a
    subset without replacement for the rest (unsorted; the batch sampler orders them)."""
    if size == 0:
        return np.empty(0, dtype=np.int64)
    passes, rest = divmod(int(count), int(size))
    subset = rng.choice(size, rest, replace=False) if rest else np.empty(0, dtype=np.int64)
    return np.concatenate([np.tile(np.arange(size, dtype=np.int64), passes), subset.astype(np.int64)])


class ConcatenatedCorpus:
    """Several `EncodedCorpus` as one, without copying their tokens: pair j of part p is pair
    `starts[p] + j`. It offers what batching reads of a corpus (lengths, `target_pieces`,
    `src`/`tgt`, `len`); `collate` gathers tokens part by part through `split_indices`."""

    def __init__(self, parts: Sequence[EncodedCorpus]) -> None:
        if not parts:
            raise ValueError("a concatenation needs at least one corpus")
        self.parts = list(parts)
        self.starts = np.concatenate([[0], np.cumsum([len(part) for part in self.parts])]).astype(np.int64)
        self.src_lengths = np.concatenate([part.src_lengths for part in self.parts])  # (n,) as EncodedCorpus's
        self.tgt_lengths = np.concatenate([part.tgt_lengths for part in self.parts])

    def __len__(self) -> int:
        return int(self.starts[-1])

    @property
    def sizes(self) -> np.ndarray:
        """Pairs per part."""
        return np.diff(self.starts)

    def locate(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(part, index within that part) of each global index."""
        indices = np.asarray(indices, dtype=np.int64)
        part = np.searchsorted(self.starts, indices, side="right") - 1  # "right": empty parts are skipped
        return part, indices - self.starts[part]

    def split_indices(self, indices: np.ndarray) -> list[tuple[np.ndarray, EncodedCorpus, np.ndarray]]:
        """(rows of `indices`, part, their indices within the part), for each part they touch."""
        part, local = self.locate(indices)
        return [(rows, self.parts[p], local[rows]) for p in np.unique(part) for rows in [np.flatnonzero(part == p)]]

    def src(self, i: int) -> np.ndarray:
        (part,), (local,) = self.locate(np.array([i]))
        return self.parts[int(part)].src(int(local))

    def tgt(self, i: int) -> np.ndarray:
        (part,), (local,) = self.locate(np.array([i]))
        return self.parts[int(part)].tgt(int(local))

    def target_pieces(self) -> np.ndarray:
        """The distinct target token ids of all parts, ascending."""
        return np.unique(np.concatenate([part.target_pieces() for part in self.parts]))


def corpus_labels(parts: Sequence[CorpusPart]) -> list[str]:
    """Each part's name in logs and metrics: its name, with its direction where names repeat
    (Multi30k's de-en and en-de are both `multi30k`), and its position where that repeats too."""
    labels = [part.name for part in parts]
    if len(set(labels)) < len(labels):
        labels = [f"{part.name}-{part.src}-{part.tgt}" for part in parts]
    if len(set(labels)) < len(labels):
        labels = [f"{label}#{i + 1}" for i, label in enumerate(labels)]
    return labels


@dataclass(frozen=True)
class EpochDraw:
    """What one epoch's draw holds of each corpus: pairs, and target tokens (the labels the loss
    averages over: pieces + eos)."""

    epoch: int
    labels: tuple[str, ...]
    sizes: tuple[int, ...]  # each corpus's pairs
    pairs: tuple[int, ...]  # drawn from each
    tokens: tuple[int, ...]

    def shares(self) -> dict[str, dict[str, float]]:
        """{label: {"pairs": share, "tokens": share, "passes": drawn / size}} (metrics.json, TensorBoard)."""
        pairs, tokens = max(sum(self.pairs), 1), max(sum(self.tokens), 1)
        return {
            label: {
                "pairs": round(p / pairs, 6),
                "tokens": round(t / tokens, 6),
                "passes": round(p / size, 4) if size else 0.0,
            }
            for label, size, p, t in zip(self.labels, self.sizes, self.pairs, self.tokens, strict=True)
        }

    def describe(self) -> str:
        """The log line, e.g. `epoch 3 draw: 29,000 pairs, 361,322 target tokens | multi30k 50.1% pairs
        49.0% tokens (1.00 passes) | bt 49.9% pairs 51.0% tokens (0.52 passes)`."""
        corpora = " | ".join(
            f"{label} {100 * s['pairs']:.1f}% pairs {100 * s['tokens']:.1f}% tokens ({s['passes']:.2f} passes)"
            for label, s in self.shares().items()
        )
        return f"epoch {self.epoch} draw: {sum(self.pairs):,} pairs, {sum(self.tokens):,} target tokens | {corpora}"


class CorpusMixture:
    """The training corpora as one `ConcatenatedCorpus`, each one's share of an epoch, and each
    epoch's draw from them."""

    def __init__(self, parts: Sequence[CorpusPart], temperature: float) -> None:
        self.labels = corpus_labels(parts)
        self.weights = [float(part.weight) for part in parts]
        self.temperature = float(temperature)
        self.corpus = ConcatenatedCorpus([part.corpus for part in parts])
        self.shares = corpus_shares(self.corpus.sizes, self.weights, temperature)
        self.counts = draw_counts(self.shares, len(self.corpus))

    def draw(self, seed: int, epoch: int) -> np.ndarray:
        """The global indices epoch `epoch` trains on (duplicates where a corpus is repeated);
        a function of (seed, epoch) alone."""
        # starts[:-1]: the last start is the total, not a corpus
        drawn = [
            start + draw_corpus(size, count, np.random.default_rng([seed, epoch, i]))
            for i, (start, size, count) in enumerate(
                zip(self.corpus.starts[:-1], self.corpus.sizes, self.counts, strict=True)
            )
        ]
        return np.concatenate(drawn)

    def summarize(self, epoch: int, indices: np.ndarray) -> EpochDraw:
        """Each corpus's pairs and target tokens among the drawn `indices`."""
        part, _ = self.corpus.locate(indices)
        parts = len(self.labels)
        pairs = np.bincount(part, minlength=parts)
        tokens = np.bincount(part, weights=self.corpus.tgt_lengths[indices] + 1, minlength=parts)
        return EpochDraw(
            epoch,
            tuple(self.labels),
            tuple(int(s) for s in self.corpus.sizes),
            tuple(int(p) for p in pairs),
            tuple(int(t) for t in tokens),
        )

    def describe(self) -> str:
        return f"{len(self.labels)} corpora drawn by weight x size^(1/{self.temperature:g}): " + ", ".join(
            f"{label} {100 * share:.1f}%" for label, share in zip(self.labels, self.shares, strict=True)
        )


class MixtureSampler:
    """`TokenBatchSampler`'s `batches(epoch)` over each epoch's draw from a `CorpusMixture`,
    as global indices of `mixture.corpus`. Every rank draws the same pairs and cuts the same
    batches from them; rank r then takes its share as `TokenBatchSampler` deals it."""

    def __init__(
        self,
        mixture: CorpusMixture,
        *,
        max_tokens: int,
        seed: int,
        num_replicas: int = 1,
        rank: int = 0,
        pad_to_multiple: int = 1,
        bucket_widths: np.ndarray | None = None,
    ) -> None:
        self.mixture = mixture
        self.seed = seed
        self.max_tokens = max_tokens
        self.replicas = (num_replicas, rank)
        self.pad_to_multiple = pad_to_multiple
        self.bucket_widths = bucket_widths
        self._last: tuple[int, np.ndarray] | None = None  # (epoch, its draw): drawn once, summarised once

    def drawn(self, epoch: int) -> np.ndarray:
        if self._last is None or self._last[0] != epoch:
            self._last = (epoch, self.mixture.draw(self.seed, epoch))
        return self._last[1]

    def batches(self, epoch: int) -> list[np.ndarray]:
        """This rank's batches of `epoch`'s draw."""
        indices, sampler = self._sampler(epoch)
        return [np.where(batch >= 0, indices[batch], -1) for batch in sampler.batches(epoch)]  # -1: a dummy row

    def job_batches(self, epoch: int) -> list[np.ndarray]:
        """Every rank's batches of `epoch`'s draw, dealt as `TokenBatchSampler.job_batches`."""
        indices, sampler = self._sampler(epoch)
        return [np.where(batch >= 0, indices[batch], -1) for batch in sampler.job_batches(epoch)]

    def _sampler(self, epoch: int) -> tuple[np.ndarray, TokenBatchSampler]:
        """`epoch`'s draw and the `TokenBatchSampler` over its lengths."""
        # Imported here: batching loads torch, and preparation (which imports CorpusPart from
        # this module) never needs it.
        from mtrain.batches.batching import TokenBatchSampler

        indices = self.drawn(epoch)
        corpus = self.mixture.corpus
        sampler = TokenBatchSampler(
            corpus.src_lengths[indices],
            corpus.tgt_lengths[indices],
            self.max_tokens,
            self.seed,
            shuffle=True,
            num_replicas=self.replicas[0],
            rank=self.replicas[1],
            pad_to_multiple=self.pad_to_multiple,
            bucket_widths=self.bucket_widths,
        )
        return indices, sampler

    def epoch_draw(self, epoch: int) -> EpochDraw:
        return self.mixture.summarize(epoch, self.drawn(epoch))
