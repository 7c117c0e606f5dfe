"""Token-budget batches and their tensors: `TokenBatchSampler`, `collate` and `Batch`.

Batches are cut from the corpus sorted by the width a sentence costs its batch, then by
target and source length, so that little padding is wasted. The cost of a batch is
`sentences * max(padded src_len, padded tgt_len + 1)` (the +1: the decoder sees `[bos] y`)
and never exceeds `max_tokens`, except that a sentence longer than the budget gets a batch
of its own. Only the length arrays are read here; token data is
touched by `collate`, batch by batch.

With `pad_to_multiple` m > 1 both padded lengths are rounded up to multiples of m, and so
is the width the sentences are grouped by, so almost every batch of a width group
holds the same number of sentences: an epoch has a few dozen tensor shapes instead of
hundreds, whatever the corpus size (at most one batch per width group has another count).
Fewer shapes let torch.compile reuse its graphs and the allocator reuse its blocks.

With shape buckets (`bucket_widths`, mtrain.batches.buckets) every batch pads both sides to
one of a few widths and the sentences of a width are cut into batches of one row count
(dummy rows, index -1, fill the short ones): a compiled update sees at most that many shapes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from mtrain.batches.buckets import bucket_of, bucketed_batches, pair_widths

if TYPE_CHECKING:
    from mtrain.batches.guided_alignment import GuidedAlignments


@dataclass
class Batch:
    src_tokens: torch.Tensor  # (batch, src_len) int64, each row ends with eos, then pad
    src_padding_mask: torch.Tensor  # (batch, src_len) bool, True at padding
    tgt_input: torch.Tensor  # (batch, tgt_len) [bos] y, then pad
    tgt_output: torch.Tensor  # (batch, tgt_len) y [eos], then pad
    indices: torch.Tensor  # (batch,) positions in the corpus
    num_src_tokens: int  # non-pad source tokens (eos included)
    num_tgt_tokens: int  # non-pad labels (eos included): what the loss averages over
    # With DDP, both counts over the batches every rank trains at this batch's position (this
    # one's included), known without a collective as every rank deals from one list
    # (`TokenBatchSampler.job_batches`); None: one process, whose counts are the job's.
    job_num_src_tokens: int | None = None
    job_num_tgt_tokens: int | None = None
    # (batch, tgt_len, src_len) guided alignment's targets (train.guided_alignment), else None
    alignment: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def src_padding_mask_or_none(self) -> torch.Tensor | None:
        """src_padding_mask, or None when no source is padded (the host's token count says so,
        no device read): the model's attention then runs without a mask, which is what lets
        SDPA take its flash kernel on CUDA (mtrain.model.attention)."""
        return None if self.num_src_tokens == self.src_tokens.numel() else self.src_padding_mask

    def _map(self, function: Any) -> Batch:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return Batch(**{k: function(v) if isinstance(v, torch.Tensor) else v for k, v in values.items()})

    def to(self, device: Any, non_blocking: bool = False) -> Batch:
        return self._map(lambda tensor: tensor.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> Batch:
        """Page-locked copies for asynchronous host-to-GPU transfer (DataLoader pin_memory).

        Without an accelerator there is nothing to transfer to, and torch refuses to pin.
        """
        if not torch.cuda.is_available():
            return self
        return self._map(lambda tensor: tensor.pin_memory())


def _gather(
    tokens: np.ndarray,
    offsets: np.ndarray,
    indices: np.ndarray,
    lengths: np.ndarray,
    width: int,
    shift: int,
    pad_id: int,
) -> np.ndarray:
    """(batch, width) int64: row r holds sentence indices[r] from column `shift`, pad after."""
    out = np.full((len(indices), width), pad_id, dtype=np.int64)
    total = int(lengths.sum())
    rows = np.repeat(np.arange(len(indices)), lengths)
    within = np.arange(total) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    out[rows, within + shift] = tokens[np.repeat(offsets[indices], lengths) + within]
    return out


def _gather_side(
    corpus: Any, side: str, indices: np.ndarray, lengths: np.ndarray, width: int, shift: int, pad_id: int
) -> np.ndarray:
    """`_gather` from `side` ("src" or "tgt") of an EncodedCorpus, or of each part of a
    ConcatenatedCorpus (mtrain.batches.mixture): each part's own token array is read, none copied."""
    split_indices = getattr(corpus, "split_indices", None)
    if split_indices is None:
        return _gather(
            getattr(corpus, f"{side}_tokens"),
            getattr(corpus, f"{side}_offsets"),
            indices,
            lengths,
            width,
            shift,
            pad_id,
        )
    out = np.full((len(indices), width), pad_id, dtype=np.int64)
    for rows, part, local in split_indices(indices):
        out[rows] = _gather_side(part, side, local, lengths[rows], width, shift, pad_id)
    return out


def round_up(lengths: Any, multiple: int) -> Any:
    """lengths rounded up to a multiple of `multiple` (an int or an integer array)."""
    return -(-lengths // multiple) * multiple


def collate(
    corpus: Any,
    indices: Sequence[int] | np.ndarray,
    pad_id: int,
    bos_id: int,
    eos_id: int,
    pad_to_multiple: int = 1,
    bucket_widths: np.ndarray | None = None,
    guided: GuidedAlignments | None = None,
) -> Batch:
    """The padded tensors of the pairs at `indices` of an EncodedCorpus or a ConcatenatedCorpus
    (teacher forcing); src_len and tgt_len are rounded up to multiples of `pad_to_multiple`.
    With `bucket_widths` both are the bucket width of the widest pair, and an index -1 is a
    dummy row: source eos, target input bos, no label (mtrain.batches.buckets). With `guided`,
    the batch carries guided alignment's targets (mtrain.batches.guided_alignment)."""
    indices = np.asarray(indices, dtype=np.int64)
    dummy_rows = int(np.count_nonzero(indices < 0))
    indices = indices[indices >= 0]  # the dummy rows go last
    src_lengths = corpus.src_lengths[indices]
    tgt_lengths = corpus.tgt_lengths[indices]
    rows = np.arange(len(indices))

    src_width = round_up(int(src_lengths.max()), pad_to_multiple)
    tgt_width = round_up(int(tgt_lengths.max()) + 1, pad_to_multiple)
    if bucket_widths is not None:
        src_width = tgt_width = int(bucket_of(np.asarray([max(src_width, tgt_width)]), bucket_widths)[0])
    src = _gather_side(corpus, "src", indices, src_lengths, src_width, 0, pad_id)
    tgt_input = _gather_side(corpus, "tgt", indices, tgt_lengths, tgt_width, 1, pad_id)
    tgt_output = _gather_side(corpus, "tgt", indices, tgt_lengths, tgt_width, 0, pad_id)
    tgt_output[rows, tgt_lengths] = eos_id
    if dummy_rows:
        src_lengths = np.concatenate([src_lengths, np.ones(dummy_rows, dtype=np.int64)])
        src = np.concatenate([src, np.full((dummy_rows, src_width), pad_id, dtype=np.int64)])
        src[len(indices) :, 0] = eos_id
        tgt_input = np.concatenate([tgt_input, np.full((dummy_rows, tgt_width), pad_id, dtype=np.int64)])
        tgt_output = np.concatenate([tgt_output, np.full((dummy_rows, tgt_width), pad_id, dtype=np.int64)])
    tgt_input[:, 0] = bos_id
    padding = np.arange(src.shape[1])[None, :] >= src_lengths[:, None]
    alignment = None
    if guided is not None:
        rows_indices = np.concatenate([indices, np.full(dummy_rows, -1, dtype=np.int64)])
        alignment = guided.targets(rows_indices, src.shape[1], tgt_input.shape[1])
    return Batch(
        src_tokens=torch.from_numpy(src),
        src_padding_mask=torch.from_numpy(padding),
        tgt_input=torch.from_numpy(tgt_input),
        tgt_output=torch.from_numpy(tgt_output),
        indices=torch.from_numpy(indices),
        num_src_tokens=int(src_lengths[: len(indices)].sum()),
        num_tgt_tokens=int(tgt_lengths.sum()) + len(indices),
        alignment=alignment,
    )


class TokenBatchSampler:
    """Token-budget batches from length-sorted buckets, reshuffled per epoch from the seed.

    Each epoch: sort by (padded width, tgt length, src length) with random tie-breaks, cut the
    sorted order greedily into batches under `max_tokens`, shuffle the batch order. Everything is drawn
    from (seed, epoch), so every rank computes the same list and a resumed run gets the same
    batches. With `num_replicas` > 1, rank r takes batches r, r + R, r + 2R, ... of that
    list; the last `len % num_replicas` batches are dropped so that every rank runs the same
    number of steps (a different few each epoch, as the order is reshuffled). Without
    shuffling (validation) the batches come in length order, all of them for one replica.
    With `pad_to_multiple` > 1 the budget and the width count the rounded lengths `collate`
    pads to (see the module docstring). With `bucket_widths` (mtrain.batches.buckets) each
    batch holds pairs of one bucket, in random order when shuffling (padding to the bucket's
    width is the same whatever their lengths), and dummy rows (-1) even out a bucket's batches.
    """

    def __init__(
        self,
        src_lengths: np.ndarray,
        tgt_lengths: np.ndarray,
        max_tokens: int,
        seed: int,
        shuffle: bool = True,
        num_replicas: int = 1,
        rank: int = 0,
        pad_to_multiple: int = 1,
        bucket_widths: np.ndarray | None = None,
    ) -> None:
        if max_tokens <= 0:
            raise ValueError(f"max_tokens must be positive, got {max_tokens}")
        if pad_to_multiple <= 0:
            raise ValueError(f"pad_to_multiple must be positive, got {pad_to_multiple}")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is not in [0, {num_replicas})")
        self.src_lengths = np.asarray(src_lengths, dtype=np.int64)
        self.tgt_lengths = np.asarray(tgt_lengths, dtype=np.int64)
        # Padded width a sentence imposes on its batch: the decoder input is [bos] y.
        self.sizes = np.maximum(
            round_up(self.src_lengths, pad_to_multiple), round_up(self.tgt_lengths + 1, pad_to_multiple)
        )
        self.bucketed = bucket_widths is not None
        if bucket_widths is not None:  # the width both sides are padded to
            self.sizes = bucket_of(pair_widths(self.src_lengths, self.tgt_lengths), bucket_widths, pad_to_multiple)
        self.max_tokens = max_tokens
        self.seed = seed
        self.shuffle = shuffle
        self.num_replicas = num_replicas
        self.rank = rank

    def batches(self, epoch: int) -> list[np.ndarray]:
        """This rank's batches (arrays of corpus indices) for `epoch`; deterministic."""
        batches = self.job_batches(epoch)
        return batches[self.rank :: self.num_replicas] if self.num_replicas > 1 else batches

    def job_batches(self, epoch: int) -> list[np.ndarray]:
        """Every rank's batches for `epoch`: rank r's batch at position p is `[p * num_replicas + r]`.
        Any rank can count what the others train (the update's token count needs no collective)."""
        if len(self.sizes) == 0:
            return []
        rng = np.random.default_rng([self.seed, epoch])
        # lexsort: the last key sorts first. The width a sentence costs its batch comes first,
        # so that the budget, which counts that width, is filled tightly; then the target and
        # source lengths, so that neither side pads much (docs/PERFORMANCE.md: 2.8% padding
        # and 244 batches an epoch on Multi30k, against 4.3% and 256 sorted by source length).
        keys = [self.src_lengths, self.tgt_lengths, self.sizes]
        if self.shuffle:
            # within a bucket, lengths do not change the padding: the order is random
            keys = [rng.random(len(self.sizes)), *(keys[2:] if self.bucketed else keys)]
        order = np.lexsort(keys)
        if self.bucketed:
            batches = bucketed_batches(order, self.sizes, self.max_tokens)
        else:
            bounds = _budget_bounds(self.sizes[order], self.max_tokens)
            batches = np.split(order, bounds[1:-1])
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches[: len(batches) - len(batches) % self.num_replicas]


def _budget_bounds(sizes: np.ndarray, max_tokens: int) -> np.ndarray:
    """Start positions of greedy batches over `sizes` (plus the end): each batch is as long
    as `count * running max size <= max_tokens` allows, and at least one sentence.

    The running max of a batch is at least the size of its first sentence, so a batch never
    holds more than max_tokens // sizes[start] sentences: only that window is examined, one
    numpy call per batch instead of a Python step per sentence.
    """
    bounds = [0]
    start, total = 0, len(sizes)
    while start < total:
        window = sizes[start : start + max(1, max_tokens // int(sizes[start]))]
        costs = np.arange(1, len(window) + 1) * np.maximum.accumulate(window)
        count = int(np.searchsorted(costs, max_tokens, side="right"))  # costs never decrease
        start += max(count, 1)
        bounds.append(start)
    return np.asarray(bounds)
