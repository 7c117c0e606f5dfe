"""Subword regularisation: the training split in several sampled segmentations, one per epoch.

With `data.subword_sampling.alpha` > 0 the training pairs are segmented again, `copies` times,
by sampling from SentencePiece's segmentation lattice (unigram, Kudo 2018) or by dropping
merges (BPE-dropout, Provilkov et al. 2020), and epoch e trains on copy (e - 1) % copies. The
model sees a word split several ways, which regularises it on small corpora; validation, test
and decoding keep the deterministic segmentation.

The copies are encoded once, ahead of training, and cached next to the encoded corpus they
re-segment: each is an `EncodedCorpus` aligned pair by pair with the training split (same
pairs, same order, other token ids and lengths), so batching, resuming and DDP sharding work
on them unchanged. A copy is made from the training split's own tokens, decoded back to
(normalised) text, so it holds exactly the pairs the filters kept. Copy k draws from its own
seed and is encoded in one thread: the same settings give the same copies on every machine.
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import numpy as np

from mtrain.batches.corpus import CorpusWriter, EncodedCorpus
from mtrain.batches.encoding import flatten_sequences, sequence_lengths
from mtrain.config import SubwordSamplingConfig, TokenizerModel
from mtrain.errors import MtrainError

SAMPLING_FORMAT = 1  # bump when the way copies are made changes
_CHUNK = 20_000  # pairs decoded and re-encoded at a time
_SEED = 1_000_003  # copy k samples with seed _SEED + k


def sampling_enabled(cfg: SubwordSamplingConfig) -> bool:
    return float(cfg.alpha) > 0.0


def check_sampling_config(cfg: SubwordSamplingConfig, model_type: TokenizerModel) -> None:
    """`data.subword_sampling` against the tokenizer's model type; one-line errors naming the key."""
    alpha = float(cfg.alpha)
    if alpha < 0.0:
        raise MtrainError(f"data.subword_sampling.alpha: {alpha} must be >= 0 (0: no sampling)")
    if alpha == 0.0:
        return
    if model_type == TokenizerModel.bpe and not alpha < 1.0:
        raise MtrainError(
            f"data.subword_sampling.alpha: {alpha} is BPE-dropout's merge-drop probability "
            "with tokenizer.model_type=bpe; it must be in (0, 1)"
        )
    if cfg.nbest_size != -1 and cfg.nbest_size < 2:
        raise MtrainError(
            f"data.subword_sampling.nbest_size: {cfg.nbest_size} must be -1 (all segmentations) "
            "or at least 2 (1 would always give the best one)"
        )
    if cfg.copies < 1:
        raise MtrainError(f"data.subword_sampling.copies: {cfg.copies} must be at least 1")


def build_copies(
    staging: Path,
    train: EncodedCorpus,
    model_files: tuple[str, str],
    eos_id: int,
    cfg: SubwordSamplingConfig,
    workers: int,
) -> None:
    """Write copy_0 .. copy_{copies-1} of `train` into `staging`, each a corpus directory."""
    assert train.directory is not None  # a cache entry on disk (workers open it by its path)
    tasks = [
        (staging / f"copy_{k}", train.directory, model_files, eos_id, float(cfg.alpha), int(cfg.nbest_size), _SEED + k)
        for k in range(cfg.copies)
    ]
    if workers <= 1 or len(tasks) == 1:
        for task in tasks:
            _write_copy(task)
        return
    with multiprocessing.get_context().Pool(min(workers, len(tasks))) as pool:
        pool.map(_write_copy, tasks, chunksize=1)


def open_copies(directory: Path, copies: int) -> list[EncodedCorpus]:
    return [EncodedCorpus.open(directory / f"copy_{k}") for k in range(copies)]


def _write_copy(task: tuple[Path, Path, tuple[str, str], int, float, int, int]) -> None:
    """One sampled segmentation of the training split (a picklable task for a worker process)."""
    import sentencepiece as spm

    directory, train_directory, (src_model, tgt_model), eos_id, alpha, nbest_size, seed = task
    train = EncodedCorpus.open(train_directory)
    src = spm.SentencePieceProcessor(model_file=src_model)
    tgt = src if tgt_model == src_model else spm.SentencePieceProcessor(model_file=tgt_model)
    # One seed per copy and one thread per encode: the sampler's draws then come in a fixed
    # order (SentencePiece's multi-threaded batch encode would interleave them).
    spm.set_random_generator_seed(seed)
    writer = CorpusWriter(directory, train.src_tokens.dtype)
    for start in range(0, len(train), _CHUNK):
        rows = range(start, min(start + _CHUNK, len(train)))
        # source sentences are stored with their eos, targets bare
        src_text = src.decode([train.src(i)[:-1].tolist() for i in rows])
        tgt_text = tgt.decode([train.tgt(i).tolist() for i in rows])
        src_ids = _sample(src, src_text, alpha, nbest_size)
        tgt_ids = _sample(tgt, tgt_text, alpha, nbest_size)
        every = np.arange(len(rows))
        src_flat, src_lengths = flatten_sequences(src_ids, every, sequence_lengths(src_ids), writer.dtype, eos_id)
        tgt_flat, tgt_lengths = flatten_sequences(tgt_ids, every, sequence_lengths(tgt_ids), writer.dtype, None)
        writer.append(src_flat, src_lengths, tgt_flat, tgt_lengths)
    writer.close()


def _sample(processor: Any, texts: list[str], alpha: float, nbest_size: int) -> list[list[int]]:
    ids: list[list[int]] = processor.encode(
        texts, enable_sampling=True, alpha=alpha, nbest_size=nbest_size, num_threads=1
    )  # (SentencePiece's stub types every encode as Any)
    return ids
