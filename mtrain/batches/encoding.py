"""Encode chunks of sentence pairs into flat token arrays, in parallel worker processes.

The main process reads pairs and cuts them into chunks of `data.chunk_size`; each chunk is
normalised, tokenized, filtered and flattened into numpy arrays by a worker
(`data.num_workers` processes; 1 encodes in the main process). Results come back in corpus
order, with at most two chunks per worker in flight, so memory stays bounded however large
the corpus is. This module imports neither torch nor the rest of mtrain's training stack,
which keeps worker start-up cheap.
"""

from __future__ import annotations

import itertools
import multiprocessing
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mtrain.config import CleanConfig
from mtrain.data.cleaning import KEEP, classify_pairs, count_reasons, normalizer, pair_hashes, reject_where
from mtrain.data.overlap import text_hashes

Pair = tuple[str, str]


@dataclass
class EncodedChunk:
    src_tokens: np.ndarray  # all source sentences back to back, each followed by eos
    src_lengths: np.ndarray  # (n,) including the eos
    tgt_tokens: np.ndarray  # target ids after the target prefix, if any (bos/eos are added when batching)
    tgt_lengths: np.ndarray  # (n,)
    hashes: np.ndarray | None  # (n,) pair hashes (training split: deduplication, overlap)
    rejected: dict[str, int]  # pairs filtered out, by reason
    src_hashes: np.ndarray | None = None  # (n,) source hashes (training split: overlap)
    rows: np.ndarray | None = None  # (n,) each kept pair's position in the chunk read (line identity)


class ChunkEncoder:
    """Turns a list of pairs into an EncodedChunk; picklable, so it can travel to workers.

    `clean` is the `data.clean` section as a dict for the training split, None for
    validation/test (encoded as they are). `src_prefix`: tag ids that start every source
    (mtrain.data.tags; not counted by the length filters). `tgt_prefix`: ids that start every
    target (an M2M100/NLLB model's target-language token, which its decoder is taught to emit
    first; not counted by the length filters either). `drop_sources`: sorted source
    hashes of the evaluation sets whose pairs are dropped (`data.clean.drop_eval_overlap`).
    """

    def __init__(
        self,
        src_model: str,
        tgt_model: str,
        eos_id: int,
        dtype: str,
        clean: dict[str, Any] | None,
        src_prefix: Sequence[int] = (),
        drop_sources: np.ndarray | None = None,
        tgt_prefix: Sequence[int] = (),
    ):
        self.src_model, self.tgt_model = src_model, tgt_model
        self.eos_id = eos_id
        self.src_prefix = [int(token) for token in src_prefix]
        self.tgt_prefix = [int(token) for token in tgt_prefix]
        self.drop_sources = drop_sources
        self.dtype = np.dtype(dtype)
        self.clean = CleanConfig(**clean) if clean is not None else None
        self._processors: tuple[Any, Any] | None = None  # (source, target) SentencePieceProcessor

    def _load(self) -> tuple[Any, Any]:
        if self._processors is None:  # once per process
            from mtrain.tokenizer.marian_vocab import open_processor  # (SentencePiece, or Marian's numbering)

            src = open_processor(self.src_model)
            tgt = src if self.tgt_model == self.src_model else open_processor(self.tgt_model)
            self._processors = (src, tgt)
        return self._processors

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_processors": None}  # SentencePiece objects are reloaded

    def __call__(self, pairs: Sequence[Pair]) -> EncodedChunk:
        src_processor, tgt_processor = self._load()
        src_texts = [src for src, _ in pairs]
        tgt_texts = [tgt for _, tgt in pairs]
        if self.clean is not None and self.clean.normalize:
            normalize = normalizer(self.clean.normalize)
            src_texts = [normalize(text) for text in src_texts]
            tgt_texts = [normalize(text) for text in tgt_texts]
        src_ids: list[list[int]] = src_processor.encode(src_texts)
        tgt_ids: list[list[int]] = tgt_processor.encode(tgt_texts)
        src_lengths, tgt_lengths = sequence_lengths(src_ids), sequence_lengths(tgt_ids)

        rows = np.arange(len(pairs))
        rejected: dict[str, int] = {}
        hashes = src_hashes = None
        if self.clean is not None:
            codes = classify_pairs(src_texts, tgt_texts, src_lengths, tgt_lengths, self.clean)
            src_hashes = text_hashes(src_texts)
            if self.drop_sources is not None:
                reject_where(codes, "eval_overlap", np.isin(src_hashes, self.drop_sources))
            rejected = count_reasons(codes)
            rows = np.flatnonzero(codes == KEEP)
            hashes = pair_hashes([src_texts[i] for i in rows], [tgt_texts[i] for i in rows])
            src_hashes = src_hashes[rows]
        src_tokens, src_lengths = flatten_sequences(
            src_ids, rows, src_lengths, self.dtype, self.eos_id, self.src_prefix
        )
        tgt_tokens, tgt_lengths = flatten_sequences(tgt_ids, rows, tgt_lengths, self.dtype, None, self.tgt_prefix)
        return EncodedChunk(src_tokens, src_lengths, tgt_tokens, tgt_lengths, hashes, rejected, src_hashes, rows)


def sequence_lengths(sequences: list[list[int]]) -> np.ndarray:
    """The length of each encoded sequence, as int64."""
    return np.fromiter(map(len, sequences), np.int64, len(sequences))


def flatten_sequences(
    sequences: list[list[int]],
    rows: np.ndarray,
    lengths: np.ndarray,
    dtype: np.dtype,
    eos_id: int | None,
    prefix: Sequence[int] = (),
) -> tuple[np.ndarray, np.ndarray]:
    """The chosen `rows` of `sequences` back to back, each after `prefix` (tag ids) and
    followed by eos if given."""
    lengths = lengths[rows]
    tokens = np.fromiter(itertools.chain.from_iterable(sequences[i] for i in rows.tolist()), dtype, int(lengths.sum()))
    if prefix:
        starts = np.cumsum(lengths) - lengths  # where each sequence begins
        tokens = np.insert(tokens, np.repeat(starts, len(prefix)), np.tile(np.asarray(prefix, dtype=dtype), len(rows)))
        lengths = lengths + len(prefix)
    if eos_id is not None:
        tokens = np.insert(tokens, np.cumsum(lengths), np.asarray(eos_id, dtype=dtype))
        lengths = lengths + 1
    return tokens, lengths


# One encoder per worker process, installed by the pool's initializer.
_worker_encoder: ChunkEncoder | None = None


def _install(encoder: ChunkEncoder) -> None:
    global _worker_encoder  # noqa: PLW0603 - a pool initializer's only way to hand state to its worker
    _worker_encoder = encoder


def _encode_in_worker(pairs: Sequence[Pair]) -> EncodedChunk:
    assert _worker_encoder is not None
    return _worker_encoder(pairs)


def encode_chunks(encoder: ChunkEncoder, chunks: Iterable[list[Pair]], workers: int) -> Iterator[EncodedChunk]:
    """`encoder(chunk)` for every chunk, in order, using `workers` processes.

    `Pool.imap` would read the whole input ahead of the workers; submitting by hand keeps at
    most 2 * workers chunks in memory.
    """
    if workers <= 1:
        for chunk in chunks:
            yield encoder(chunk)
        return
    with multiprocessing.get_context().Pool(workers, initializer=_install, initargs=(encoder,)) as pool:
        pending: deque[Any] = deque()  # multiprocessing's AsyncResult of each chunk
        for chunk in chunks:
            pending.append(pool.apply_async(_encode_in_worker, (chunk,)))
            if len(pending) >= 2 * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


def chunked(pairs: Iterable[Pair], size: int) -> Iterator[list[Pair]]:
    iterator = iter(pairs)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk
