"""The training batches of each update, in a resumable order.

One corpus: one `TokenBatchSampler` per segmentation of its training split (one, or one per
subword-sampling copy: epoch e trains on copy (e - 1) % copies). Several corpora
(`data.corpora`): a `MixtureSampler`, which draws each epoch's pairs from them by weight and
temperature (mtrain.batches.mixture) and reports each epoch's draw to `draw_listener`. Either
way an epoch's batches are a function of (seed, epoch) and the position (epoch, batch within
it) is the `TrainState`'s, so a checkpoint that stores the state resumes the exact order.
On a GPU the next update's batches are collated in a background thread while the device
runs the current one (`BatchPrefetcher`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from mtrain.batches import Batch, EncodedCorpus, PreparedData, TokenBatchSampler, collate
from mtrain.batches.mixture import CorpusMixture, EpochDraw, MixtureSampler
from mtrain.tokenizer import SpecialIds
from mtrain.train.prefetch import BatchPrefetcher
from mtrain.train.progress import TrainState

# What epochs train on: the segmentations of one corpus, or several corpora drawn from.
TrainingCorpora = Sequence[EncodedCorpus] | CorpusMixture


def training_corpora(data: PreparedData, temperature: float) -> TrainingCorpora:
    """A mixture of `data.train_parts` when there are several (drawn by weight and `temperature`,
    data.sampling_temperature); else the one corpus's segmentations, exactly as before mixtures."""
    if len(data.train_parts) > 1:  # (subword-sampling copies exist for one corpus only: config_checks)
        return CorpusMixture(data.train_parts, temperature)
    return data.train_copies or [data.train]


class BatchSource:
    """`next_update(state)`: the next `update_freq` batches of this rank, on the device."""

    def __init__(
        self,
        corpora: TrainingCorpora,
        special_ids: SpecialIds,
        device: torch.device,
        *,
        max_tokens: int,
        update_freq: int,
        max_epochs: int | None,
        seed: int,
        pad_to_multiple: int,
        num_replicas: int = 1,
        rank: int = 0,
        prefetch: bool = False,
    ) -> None:
        self.special_ids = special_ids
        self.device = device
        self.update_freq = update_freq
        self.max_epochs = max_epochs
        self.pad_to_multiple = pad_to_multiple
        options = dict(
            max_tokens=max_tokens, seed=seed, num_replicas=num_replicas, rank=rank, pad_to_multiple=pad_to_multiple
        )
        self.samplers: list[TokenBatchSampler | MixtureSampler]
        self.mixture = corpora if isinstance(corpora, CorpusMixture) else None
        if isinstance(corpora, CorpusMixture):  # one view of all corpora, a new draw from it each epoch
            self.corpora: list[Any] = [corpora.corpus]
            self.samplers = [MixtureSampler(corpora, **options)]
        else:  # one sampler per segmentation: each cuts its batches from its own lengths
            self.corpora = list(corpora)
            self.samplers = [
                TokenBatchSampler(corpus.src_lengths, corpus.tgt_lengths, shuffle=True, **options)
                for corpus in self.corpora
            ]
        # Called with each epoch's draw from several corpora and the update that begins it (rank 0's
        # MetricLogger.log_draw, set by the Trainer).
        self.draw_listener: Callable[[EpochDraw, int], None] | None = None
        self._prefetcher = BatchPrefetcher(self._host_batch, update_freq) if prefetch else None
        self._epoch_batches: list[np.ndarray] | None = None

    @property
    def pairs(self) -> int:
        return len(self.corpora[0])

    def describe(self) -> str:
        """How many pairs an epoch holds, and for several corpora their shares."""
        return f"{self.pairs} training pairs" + ("" if self.mixture is None else f" from {self.mixture.describe()}")

    def summary(self, epoch: int) -> dict[str, Any]:
        """For metrics.json: with several corpora, each one's share of epoch `epoch`'s draw."""
        if self.mixture is None:
            return {}
        draw = self.samplers[0].epoch_draw(epoch)
        return {"draw": {"epoch": epoch, "corpora": draw.shares()}}

    def next_update(self, state: TrainState) -> list[Batch] | None:
        """The batches of the next update from `state`'s position, which they advance
        (crossing epoch boundaries as needed); None once `max_epochs` is done."""
        batches: list[Batch] = []
        while len(batches) < self.update_freq:
            if self._epoch_batches is None:
                self._epoch_batches = self._batches_of_epoch(state.epoch, state.update + 1)
            if state.batch_in_epoch >= len(self._epoch_batches):
                if batches:  # finish the update with what the epoch had left
                    break
                if self.max_epochs is not None and state.epoch >= self.max_epochs:
                    return None
                state.epoch += 1
                state.batch_in_epoch = 0
                self._epoch_batches = self._batches_of_epoch(state.epoch, state.update + 1)
                continue
            position = state.batch_in_epoch
            indices = self._epoch_batches[position]
            state.batch_in_epoch += 1
            key = (state.epoch, position)
            if self._prefetcher is None:
                batch = self._host_batch(key, indices)
            else:  # this update's batches were collated while the device ran the previous one
                ahead = range(position + 1, min(position + 1 + self.update_freq, len(self._epoch_batches)))
                batch = self._prefetcher.get(key, indices, (((state.epoch, p), self._epoch_batches[p]) for p in ahead))
            batches.append(batch.to(self.device, non_blocking=True))
        return batches

    def _segmentation(self, epoch: int) -> int:
        """Which of `corpora` epoch `epoch` (1-based) trains on."""
        return (epoch - 1) % len(self.corpora)

    def _batches_of_epoch(self, epoch: int, update: int) -> list[np.ndarray]:
        """Epoch `epoch`'s batches of this rank; `update` begins it (or resumes within it)."""
        sampler = self.samplers[self._segmentation(epoch)]
        if isinstance(sampler, MixtureSampler) and self.draw_listener is not None:
            self.draw_listener(sampler.epoch_draw(epoch), update)
        return sampler.batches(epoch)

    def _host_batch(self, key: tuple[int, int], indices: np.ndarray) -> Batch:
        """The collated batch of `indices` of batch `key` = (epoch, position), in pinned memory on
        a GPU (the copy then overlaps compute). The epoch names the corpus: the prefetcher may
        still collate an epoch's last batches when the trainer has moved to the next."""
        ids = self.special_ids
        corpus = self.corpora[self._segmentation(key[0])]
        batch = collate(corpus, indices, ids.pad, ids.bos, ids.eos, self.pad_to_multiple)
        return batch.pin_memory() if self.device.type == "cuda" else batch
