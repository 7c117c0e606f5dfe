"""One training corpus encoded into its own cache entry: cleaned, tagged, first `train_limit` pairs.

The entry is keyed by what determines its arrays and nothing else: the corpus's source
fingerprint of its training split, its direction, `data.clean`, its train_limit,
`data.invalid_utf8`, the tokenizer, the tag ids its sources start with and the ids its
targets start with (an M2M100/NLLB target-language token: another pair's entry is never
reused) (plus the
evaluation sets' hashes when `data.clean.drop_eval_overlap` drops pairs by them). So another
validation or test split, or another corpus beside it, finds the entry as it was. Beside the
token arrays the entry keeps the hashes of the kept pairs (`src.hashes`, `pair.hashes`,
uint64), from which train–test overlap is counted against any evaluation set without
reading the text again (mtrain.data.overlap), and each kept pair's line in the corpus as read
(`line.numbers`, uint64, 0-based), which line-aligned side files (guided alignment:
mtrain.batches.guided_alignment) follow through cleaning and deduplication.
"""

from __future__ import annotations

import itertools
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mtrain.batches.corpus import CorpusWriter, EncodedCorpus, token_dtype
from mtrain.batches.encoding import ChunkEncoder, EncodedChunk, chunked, encode_chunks
from mtrain.config import DataConfig, to_plain
from mtrain.data.cache import build_entry, cache_root, fingerprint, is_complete
from mtrain.data.cleaning import REASONS, Deduplicator
from mtrain.data.corpora import TrainingCorpus
from mtrain.data.overlap import EvalHashes
from mtrain.data.sources import ReadStats
from mtrain.errors import MtrainError
from mtrain.tokenizer import Tokenizer

# bump when the stored layout or the encoding changes (2: one entry per training corpus;
# 3: line.numbers)
CACHE_FORMAT = 3
PROGRESS_EVERY = 1_000_000  # training pairs between progress lines
HASH_FILES = ("src.hashes", "pair.hashes")
LINE_NUMBERS = "line.numbers"

Log = Callable[[str], Any]


@dataclass
class EncodedTrainingSet:
    """A training corpus as cached: its arrays, the hashes of its kept pairs, its counts."""

    corpus: EncodedCorpus
    src_hashes: np.ndarray  # (n,) uint64, memory-mapped
    pair_hashes: np.ndarray  # (n,) uint64, memory-mapped
    summary: dict[str, Any]  # read, filtered by reason, kept, tokens, invalid_utf8
    entry: Path
    key: str
    cache_hit: bool


def training_set(
    corpus: TrainingCorpus,
    data: DataConfig,
    tokenizer: Tokenizer,
    model_files: tuple[str, str],
    tag_ids: list[int],
    drop: EvalHashes | None,
    log: Log,
    tgt_prefix: list[int] | None = None,
) -> EncodedTrainingSet:
    """`corpus`'s training split from its cache entry, encoded first if there is none.
    `drop`: the evaluation sets whose sources are dropped (data.clean.drop_eval_overlap).
    `tgt_prefix`: ids that start every target (an M2M100/NLLB model's target-language token)."""
    cfg = corpus.cfg
    tgt_prefix = tgt_prefix or []
    key = fingerprint(
        "corpus",
        CACHE_FORMAT,
        tokenizer.fingerprint,
        corpus.source.fingerprint("train"),
        cfg.src,
        cfg.tgt,
        data.clean,
        cfg.train_limit,
        data.invalid_utf8,
        tag_ids,
        drop.digest() if drop is not None else None,
        *([tgt_prefix] if tgt_prefix else []),  # (absent otherwise: the entries of native runs keep their keys)
    )
    # Named by the corpus, not its label (which depends on the other entries of data.corpora).
    entry = cache_root(data.cache_dir) / "corpora" / f"{cfg.name}-{cfg.src}-{cfg.tgt}-{key[:16]}"
    hit = is_complete(entry)
    if hit:
        log(f"data: cache hit, reusing the encoded corpus in {entry} (nothing to encode)")
    else:
        start = time.perf_counter()
        with build_entry(entry, log) as staging:
            counts = _encode(staging, corpus, data, tokenizer, model_files, tag_ids, drop, log, tgt_prefix)
            stored: dict[str, Any] = {"train": counts, "seconds": round(time.perf_counter() - start, 2)}
            (staging / "summary.json").write_text(json.dumps(stored, indent=1), encoding="utf-8")
        rate = counts["read"] / max(stored["seconds"], 1e-9)
        log(f"data: encoded in {stored['seconds']:.1f} s ({rate:,.0f} training pairs/s) -> {entry}")
    summary = json.loads((entry / "summary.json").read_text(encoding="utf-8"))["train"]
    src_hashes, pair_hashes = (_map_hashes(entry / "train" / name) for name in HASH_FILES)
    return EncodedTrainingSet(EncodedCorpus.open(entry / "train"), src_hashes, pair_hashes, summary, entry, key, hit)


def line_numbers(entry: Path) -> np.ndarray:
    """(n,) uint64: the 0-based line of the corpus (as read) of each kept training pair."""
    return _map_hashes(entry / "train" / LINE_NUMBERS)


def _map_hashes(path: Path) -> np.ndarray:
    if path.stat().st_size == 0:
        return np.empty(0, dtype=np.uint64)
    return np.memmap(path, dtype=np.uint64, mode="r")


def _encode(
    staging: Path,
    corpus: TrainingCorpus,
    data: DataConfig,
    tokenizer: Tokenizer,
    model_files: tuple[str, str],
    tag_ids: list[int],
    drop: EvalHashes | None,
    log: Log,
    tgt_prefix: list[int],
) -> dict[str, Any]:
    """Write train/ (arrays and hashes) into `staging`; returns the counts for summary.json."""
    cfg = corpus.cfg
    dtype = token_dtype(max(tokenizer.src_vocab_size, tokenizer.tgt_vocab_size))
    stats = ReadStats()
    pairs = itertools.islice(corpus.source.pairs("train", stats), cfg.train_limit)
    encoder = ChunkEncoder(
        *model_files,
        tokenizer.eos_id,
        dtype.name,
        clean=to_plain(data.clean),
        src_prefix=tag_ids,
        drop_sources=drop.sources if drop is not None else None,
        tgt_prefix=tgt_prefix,
    )
    deduplicator = Deduplicator() if data.clean.deduplicate else None
    writer = CorpusWriter(staging / "train", dtype)
    hash_files = {name: open(staging / "train" / name, "wb") for name in (*HASH_FILES, LINE_NUMBERS)}
    rejected: Counter[str] = Counter(dict.fromkeys(REASONS, 0))
    read, next_progress, start = 0, PROGRESS_EVERY, time.perf_counter()
    where = "train" if corpus.key == "data" else f"train [{corpus.label}]"
    try:
        for chunk in encode_chunks(encoder, chunked(pairs, data.chunk_size), data.num_workers):
            assert chunk.hashes is not None and chunk.rows is not None  # encoded with data.clean
            first_line = read
            rejected.update(chunk.rejected)
            read += len(chunk.src_lengths) + sum(chunk.rejected.values())
            if deduplicator is not None:
                keep = deduplicator.first_occurrences(chunk.hashes)
                rejected["duplicate"] += int((~keep).sum())
                chunk = _subset(chunk, keep)
            writer.append(chunk.src_tokens, chunk.src_lengths, chunk.tgt_tokens, chunk.tgt_lengths)
            hash_files["src.hashes"].write(np.ascontiguousarray(chunk.src_hashes, dtype=np.uint64).tobytes())
            hash_files["pair.hashes"].write(np.ascontiguousarray(chunk.hashes, dtype=np.uint64).tobytes())
            lines = first_line + np.asarray(chunk.rows, dtype=np.uint64)
            hash_files[LINE_NUMBERS].write(np.ascontiguousarray(lines, dtype=np.uint64).tobytes())
            if read >= next_progress:
                log(f"data: {where}: {read:,} pairs read ({read / (time.perf_counter() - start):,.0f} pairs/s)")
                next_progress += PROGRESS_EVERY
    finally:
        for handle in hash_files.values():
            handle.close()
    writer.close()
    stats.report(where, log)
    if writer.size == 0:
        filtered = ", ".join(f"{reason} {count}" for reason, count in rejected.items() if count)
        raise MtrainError(
            f"{corpus.key}: the train split of {corpus.source.description} is empty after filtering ({read} pairs "
            f"read; filtered: {filtered or 'none'}); relax data.clean.* (max_len, min_len, "
            "max_len_ratio, drop_identical, drop_eval_overlap) or check the files"
        )
    return {
        "read": read,
        "filtered": {k: v for k, v in rejected.items() if v},
        "kept": writer.size,
        "src_tokens": writer.num_tokens["src"],
        "tgt_tokens": writer.num_tokens["tgt"],
        "invalid_utf8": stats.invalid_utf8,
    }


def _subset(chunk: EncodedChunk, keep: np.ndarray) -> EncodedChunk:
    """The pairs of `chunk` where `keep` is True."""
    assert chunk.hashes is not None and chunk.src_hashes is not None and chunk.rows is not None  # (see _encode)
    return EncodedChunk(
        src_tokens=chunk.src_tokens[np.repeat(keep, chunk.src_lengths)],
        src_lengths=chunk.src_lengths[keep],
        tgt_tokens=chunk.tgt_tokens[np.repeat(keep, chunk.tgt_lengths)],
        tgt_lengths=chunk.tgt_lengths[keep],
        hashes=chunk.hashes[keep],
        rejected=chunk.rejected,
        src_hashes=chunk.src_hashes[keep],
        rows=chunk.rows[keep],
    )
