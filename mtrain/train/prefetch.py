"""Batches collated ahead, in a background thread, while the device trains on the current ones.

On a GPU the host must never be what the device waits for: collating a batch (numpy
gathers, padding) and pinning it take host time that a background thread can overlap with
the device's work on the previous update. Which batch comes next stays the trainer's
decision (its epoch and position are what a checkpoint records); the prefetcher only does
the work for the batches the trainer says come next, and hands back exactly what
`collate` would have made then.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from mtrain.batches import Batch

Key = tuple[int, int]  # (epoch, batch position): names one batch of the sampler's order


class BatchPrefetcher:
    """`get(key, indices, upcoming)` returns the batch of `indices` (prepared earlier when it
    was announced) and starts preparing the `upcoming` ones."""

    def __init__(self, prepare: Callable[[Key, np.ndarray], Batch], depth: int) -> None:
        self.prepare = prepare
        self.depth = depth
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mtrain-prefetch")
        self._pending: dict[Key, Future[Batch]] = {}

    def get(self, key: Key, indices: np.ndarray, upcoming: Iterable[tuple[Key, np.ndarray]]) -> Batch:
        future = self._pending.pop(key, None)
        batch = future.result() if future is not None else self.prepare(key, indices)
        for next_key, next_indices in upcoming:
            if len(self._pending) >= self.depth:
                break
            if next_key not in self._pending:
                self._pending[next_key] = self._executor.submit(self.prepare, next_key, next_indices)
        return batch
