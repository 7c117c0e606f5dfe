"""The training batches of each update, in a resumable order.

One corpus: one `TokenBatchSampler` per segmentation of its training split (one, or one per
subword-sampling copy: epoch e trains on copy (e - 1) % copies). Several corpora
(`data.corpora`): a `MixtureSampler`, which draws each epoch's pairs from them by weight and
temperature (mtrain.batches.mixture) and reports each epoch's draw to `draw_listener`. Either
way an epoch's batches are a function of (seed, epoch) and the position (epoch, batch within
it) is the `TrainState`'s, so a checkpoint that stores the state resumes the exact order.
On a GPU the next update's batches are collated in a background thread while the device
runs the current one (`BatchPrefetcher`). With shape buckets (`train.shape_buckets`) the
bucket widths are chosen once, from every pair the run may train on, so that no epoch
brings widths of its own; each epoch that brings batch shapes not seen before logs them.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from mtrain.batches import Batch, EncodedCorpus, PreparedData, TokenBatchSampler, collate
from mtrain.batches.buckets import batch_shapes, bucket_widths, pair_widths
from mtrain.batches.guided_alignment import GuidedAlignments
from mtrain.batches.mixture import CorpusMixture, EpochDraw, MixtureSampler
from mtrain.tokenizer import SpecialIds
from mtrain.train.prefetch import BatchPrefetcher
from mtrain.train.progress import TrainState

log = logging.getLogger("mtrain")

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
        shape_buckets: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
        prefetch: bool = False,
        guided: GuidedAlignments | None = None,
    ) -> None:
        self.special_ids = special_ids
        self.guided = guided  # guided alignment's targets, batched with the pairs
        self.device = device
        self.update_freq = update_freq
        self.max_epochs = max_epochs
        self.pad_to_multiple = pad_to_multiple
        # one view of all corpora (a new draw from it each epoch), or each segmentation's own
        self.mixture: CorpusMixture | None = None
        self.corpora: list[Any]
        if isinstance(corpora, CorpusMixture):
            self.mixture, self.corpora = corpora, [corpora.corpus]
        else:
            self.corpora = list(corpora)
        self.bucket_widths = None
        if shape_buckets > 0:
            widths = np.concatenate([pair_widths(c.src_lengths, c.tgt_lengths) for c in self.corpora])
            self.bucket_widths = bucket_widths(widths, shape_buckets, pad_to_multiple)
        self.samplers: list[TokenBatchSampler | MixtureSampler]
        if self.mixture is not None:
            self.samplers = [
                MixtureSampler(
                    self.mixture,
                    max_tokens=max_tokens,
                    seed=seed,
                    num_replicas=num_replicas,
                    rank=rank,
                    pad_to_multiple=pad_to_multiple,
                    bucket_widths=self.bucket_widths,
                )
            ]
        else:  # one sampler per segmentation: each cuts its batches from its own lengths
            self.samplers = [
                TokenBatchSampler(
                    corpus.src_lengths,
                    corpus.tgt_lengths,
                    max_tokens,
                    seed,
                    shuffle=True,
                    num_replicas=num_replicas,
                    rank=rank,
                    pad_to_multiple=pad_to_multiple,
                    bucket_widths=self.bucket_widths,
                )
                for corpus in self.corpora
            ]
        self.log_shapes = rank == 0
        self.shapes_seen: set[tuple[int, int, int]] = set()
        # Called with each epoch's draw from several corpora and the update that begins it (rank 0's
        # MetricLogger.log_draw, set by the Trainer).
        self.draw_listener: Callable[[EpochDraw, int], None] | None = None
        self._prefetcher = BatchPrefetcher(self._host_batch, update_freq) if prefetch else None
        self._epoch_batches: list[np.ndarray] | None = None
        self.num_replicas = num_replicas
        # With DDP: (positions, 2) source and target tokens of every rank's batches at each position
        self._epoch_job_tokens: np.ndarray | None = None

    @property
    def pairs(self) -> int:
        return len(self.corpora[0])

    def describe(self) -> str:
        """How batches are padded, how many pairs an epoch holds, and for several corpora their shares."""
        if self.bucket_widths is None:
            padding = f"lengths padded to multiples of {self.pad_to_multiple}"
        else:
            widths = ", ".join(str(w) for w in self.bucket_widths)
            padding = f"{len(self.bucket_widths)} shape buckets (both sides padded to {widths})"
        return f"{padding} | {self.pairs} training pairs" + (
            "" if self.mixture is None else f" from {self.mixture.describe()}"
        )

    def summary(self, epoch: int) -> dict[str, Any]:
        """For metrics.json: the batch shapes trained on; with several corpora, each one's share
        of epoch `epoch`'s draw."""
        shapes = {"batch_shapes": len(self.shapes_seen)}
        if self.mixture is None:
            return shapes
        draw = self.samplers[0].epoch_draw(epoch)
        return {**shapes, "draw": {"epoch": epoch, "corpora": draw.shares()}}

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
            if self._epoch_job_tokens is not None:
                src, tgt = (int(count) for count in self._epoch_job_tokens[position])
                batch = dataclasses.replace(batch, job_num_src_tokens=src, job_num_tgt_tokens=tgt)
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
        batches = sampler.batches(epoch)
        self._note_shapes(epoch, batches)
        if self.num_replicas > 1:
            self._epoch_job_tokens = self._job_tokens(epoch, sampler.job_batches(epoch))
        return batches

    def _job_tokens(self, epoch: int, job_batches: list[np.ndarray]) -> np.ndarray:
        """(positions, 2): the source and target tokens of all ranks' batches at each position, as
        `collate` counts them (dummy rows none; a target's eos one): the update's token count that
        the loss is normalised by, read from the lengths every rank holds, so no rank waits for another."""
        corpus = self.corpora[self._segmentation(epoch)]
        counts = np.zeros((len(job_batches), 2), dtype=np.int64)
        for index, indices in enumerate(job_batches):
            real = indices[indices >= 0]
            counts[index] = (corpus.src_lengths[real].sum(), corpus.tgt_lengths[real].sum() + len(real))
        per_position: np.ndarray = counts.reshape(-1, self.num_replicas, 2).sum(axis=1)
        return per_position

    def _note_shapes(self, epoch: int, batches: list[np.ndarray]) -> None:
        """Count the epoch's tensor shapes; log them when some are new (a compiled update
        specialises, and a CUDA graph is recorded, per shape)."""
        corpus = self.corpora[self._segmentation(epoch)]
        shapes, padding = batch_shapes(
            batches, corpus.src_lengths, corpus.tgt_lengths, self.pad_to_multiple, self.bucket_widths
        )
        new = set(shapes) - self.shapes_seen
        self.shapes_seen |= new
        if new and self.log_shapes:
            log.info(
                "batches: epoch %d has %d batches in %d shapes (rows x src_len x tgt_len), %.1f%% padding; "
                "%d new, %d distinct shapes so far",
                epoch,
                len(batches),
                len(shapes),
                100 * padding,
                len(new),
                len(self.shapes_seen),
            )

    def _host_batch(self, key: tuple[int, int], indices: np.ndarray) -> Batch:
        """The collated batch of `indices` of batch `key` = (epoch, position), in pinned memory on
        a GPU (the copy then overlaps compute). The epoch names the corpus: the prefetcher may
        still collate an epoch's last batches when the trainer has moved to the next."""
        ids = self.special_ids
        corpus = self.corpora[self._segmentation(key[0])]
        batch = collate(
            corpus, indices, ids.pad, ids.bos, ids.eos, self.pad_to_multiple, self.bucket_widths, self.guided
        )
        return batch.pin_memory() if self.device.type == "cuda" else batch
