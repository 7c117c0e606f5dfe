"""`prepare_data`: from a data config to a tokenizer and encoded, memory-mapped splits.

Steps: resolve where the corpus is (local files or the Hub), train or reuse the tokenizer,
then encode train (cleaned, first `data.train_limit` pairs), valid and test (as they are,
keeping their raw text for BLEU) into one cache entry. The entry is keyed by the tokenizer,
the data fingerprints and every setting that changes the arrays, so a second run with the
same settings loads it without encoding. An interrupted build never becomes an entry (see
mtrain.data.cache) and is rebuilt by the next run.
"""

from __future__ import annotations

import itertools
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from mtrain.config import DataConfig, TokenizerConfig, to_plain
from mtrain.data.cache import build_entry, cache_root, fingerprint, is_complete
from mtrain.data.cleaning import REASONS, Deduplicator, check_clean_config
from mtrain.batches.corpus import CorpusWriter, EncodedCorpus, token_dtype
from mtrain.batches.mixture import CorpusPart
from mtrain.batches.encoding import ChunkEncoder, EncodedChunk, chunked, encode_chunks
from mtrain.batches.sampling import SAMPLING_FORMAT, build_copies, check_sampling_config, open_copies, sampling_enabled
from mtrain.data.sources import SPLITS, ParallelSource, ParallelText, ReadStats, resolve_source
from mtrain.errors import MtrainError
from mtrain.tokenizer import Tokenizer, train_or_load_tokenizer
from mtrain.tokenizer.tokenizer import JOINT_MODEL, SRC_MODEL, TGT_MODEL

CACHE_FORMAT = 1  # bump when the stored layout or the encoding changes
PROGRESS_EVERY = 1_000_000  # training pairs between progress lines

Log = Callable[[str], Any]


@dataclass
class DirectionData:
    """The evaluation sets of one direction a run trains: validation and test, encoded (with
    the direction's tags at the start of each source) and as raw text for BLEU."""

    src: str
    tgt: str
    tag_ids: List[int]  # prepended to every source sentence of this direction; [] without tags
    valid: EncodedCorpus
    valid_text: ParallelText
    test: Optional[EncodedCorpus]
    test_text: ParallelText

    @property
    def name(self) -> str:
        return f"{self.src}-{self.tgt}"


@dataclass
class PreparedData:
    tokenizer: Tokenizer
    train: EncodedCorpus
    valid: EncodedCorpus
    test: Optional[EncodedCorpus]  # None without a test split (data.splits.test=null)
    valid_text: ParallelText  # raw source/reference sentences for BLEU
    test_text: ParallelText
    directory: Path  # the cache entry holding the encoded splits
    fingerprint: str = ""  # of the encoded corpus: tokenizer, source files and settings
    # data.subword_sampling: sampled segmentations of `train`, epoch e trains on
    # train_copies[(e - 1) % len]; empty without sampling (every epoch trains on `train`)
    train_copies: List[EncodedCorpus] = field(default_factory=list)
    # data.corpora: every training corpus on its own (`train` is all of them, concatenated);
    # one part (the whole of `train`) for a single corpus
    train_parts: List[CorpusPart] = field(default_factory=list)
    # one per direction trained (valid/test/valid_text/test_text above are directions[0]'s)
    directions: List[DirectionData] = field(default_factory=list)

    def training_corpora(self) -> List[EncodedCorpus]:
        """Every segmentation training may see: `train`, and its sampled copies."""
        return [self.train, *self.train_copies]


def prepare_data(data_cfg: DataConfig, tok_cfg: TokenizerConfig, log: Log = print,
                 tokenizer: Optional[Tokenizer] = None) -> PreparedData:
    """Tokenizer and encoded splits for `data_cfg` and `tok_cfg`; either may also be the
    OmegaConf node of its section (only attributes are read). A given `tokenizer` (init_from:
    the parent run's) encodes the data instead of one trained for it."""
    check_clean_config(data_cfg.clean)
    check_sampling_config(data_cfg.subword_sampling, tok_cfg.model_type)
    source = resolve_source(data_cfg)
    log(f"data: {data_cfg.name} {data_cfg.src}->{data_cfg.tgt} from {source.description}")
    if tokenizer is None:
        tokenizer = train_or_load_tokenizer(tok_cfg, data_cfg, source=source, log=log)
    else:
        log(f"tokenizer: the given one ({', '.join(str(path) for path in tokenizer.files.values())})")
    start = time.perf_counter()
    key = fingerprint(
        "corpus", CACHE_FORMAT, tokenizer.fingerprint, [source.fingerprint(split) for split in SPLITS],
        data_cfg.src, data_cfg.tgt, data_cfg.clean, data_cfg.train_limit, data_cfg.invalid_utf8,
    )
    entry = cache_root(data_cfg.cache_dir) / "corpora" / f"{data_cfg.name}-{data_cfg.src}-{data_cfg.tgt}-{key[:16]}"
    if is_complete(entry):
        log(f"data: cache hit, reusing the encoded corpus in {entry} (nothing to encode)")
        _log_summary(json.loads((entry / "summary.json").read_text(encoding="utf-8")), log)
    else:
        with build_entry(entry, log) as staging:
            summary = _encode_corpus(staging, source, tokenizer, data_cfg, log)
            summary["seconds"] = round(time.perf_counter() - start, 2)
            (staging / "summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
        _log_summary(summary, log)
        rate = summary["train"]["read"] / max(summary["seconds"], 1e-9)
        log(f"data: encoded in {summary['seconds']:.1f} s ({rate:,.0f} training pairs/s) -> {entry}")
    data = _open(entry, tokenizer, key)
    data.train_parts = [CorpusPart(data_cfg.name, data_cfg.src, data_cfg.tgt, data.train)]
    data.directions = [DirectionData(data_cfg.src, data_cfg.tgt, [], data.valid, data.valid_text, data.test,
                                     data.test_text)]
    if sampling_enabled(data_cfg.subword_sampling):
        _add_sampled_copies(data, data_cfg, log)
    return data


def _add_sampled_copies(data: PreparedData, cfg: DataConfig, log: Log) -> None:
    """Build (or reuse) the cached sampled segmentations of the training split (`mtrain.batches.sampling`)."""
    sampling = cfg.subword_sampling
    key = fingerprint("sampled", SAMPLING_FORMAT, data.fingerprint, float(sampling.alpha), sampling.nbest_size,
                      sampling.copies)
    entry = data.directory.parent / f"{data.directory.name}-sampled-{key[:16]}"
    settings = f"alpha {sampling.alpha}, nbest_size {sampling.nbest_size}"
    if is_complete(entry):
        log(f"data: cache hit, reusing {sampling.copies} sampled segmentations of the training split ({settings})")
    else:
        start = time.perf_counter()
        with build_entry(entry, log) as staging:
            build_copies(staging, data.train, tuple(str(path) for path in _model_files(data.tokenizer)),
                         data.tokenizer.eos_id, sampling, cfg.num_workers)
        log(f"data: {sampling.copies} sampled segmentations of the training split ({settings}) in "
            f"{time.perf_counter() - start:.1f} s -> {entry}")
    data.train_copies = open_copies(entry, sampling.copies)
    data.fingerprint = key  # a resumed run must find the same copies
    tokens = [sum(int(corpus.tgt_lengths.sum()) for corpus in data.train_copies) / len(data.train_copies),
              int(data.train.tgt_lengths.sum())]
    log(f"data: subword sampling: {tokens[0] / tokens[1]:.3f}x the training targets' tokens "
        "(one copy per epoch, cycled)")


def _open(entry: Path, tokenizer: Tokenizer, fingerprint: str) -> PreparedData:
    texts = {}
    for split in ("valid", "test"):
        if not (entry / split / "text.json").is_file():  # no test split (data.splits.test=null)
            texts[split] = ParallelText()
            continue
        stored = json.loads((entry / split / "text.json").read_text(encoding="utf-8"))
        texts[split] = ParallelText(stored["src"], stored["tgt"])
    return PreparedData(
        tokenizer=tokenizer,
        train=EncodedCorpus.open(entry / "train"),
        valid=EncodedCorpus.open(entry / "valid"),
        test=EncodedCorpus.open(entry / "test") if texts["test"].src else None,
        valid_text=texts["valid"],
        test_text=texts["test"],
        directory=entry,
        fingerprint=fingerprint,
    )


def _encode_corpus(staging: Path, source: ParallelSource, tokenizer: Tokenizer, cfg: DataConfig, log: Log) -> Dict[str, Any]:
    """Write train/, valid/ and test/ into `staging`; returns the counts for summary.json."""
    dtype = token_dtype(max(tokenizer.src_vocab_size, tokenizer.tgt_vocab_size))
    src_model, tgt_model = (str(path) for path in _model_files(tokenizer))
    summary: Dict[str, Any] = {}

    stats = ReadStats()
    pairs = itertools.islice(source.pairs("train", stats), cfg.train_limit)
    encoder = ChunkEncoder(src_model, tgt_model, tokenizer.eos_id, dtype.name, clean=to_plain(cfg.clean))
    deduplicator = Deduplicator() if cfg.clean.deduplicate else None
    writer = CorpusWriter(staging / "train", dtype)
    rejected: Counter = Counter({reason: 0 for reason in REASONS})
    read, next_progress, start = 0, PROGRESS_EVERY, time.perf_counter()
    for chunk in encode_chunks(encoder, chunked(pairs, cfg.chunk_size), cfg.num_workers):
        rejected.update(chunk.rejected)
        read += len(chunk.src_lengths) + sum(chunk.rejected.values())
        if deduplicator is not None:
            keep = deduplicator.first_occurrences(chunk.hashes)
            rejected["duplicate"] += int((~keep).sum())
            chunk = _subset(chunk, keep)
        writer.append(chunk.src_tokens, chunk.src_lengths, chunk.tgt_tokens, chunk.tgt_lengths)
        if read >= next_progress:
            log(f"data: train: {read:,} pairs read ({read / (time.perf_counter() - start):,.0f} pairs/s)")
            next_progress += PROGRESS_EVERY
    writer.close()
    stats.report("train", log)
    if writer.size == 0:
        filtered = ", ".join(f"{reason} {count}" for reason, count in rejected.items() if count)
        raise MtrainError(
            f"data: the train split of {source.description} is empty after filtering ({read} pairs "
            f"read; filtered: {filtered or 'none'}); relax data.clean.* (max_len, min_len, "
            "max_len_ratio, drop_identical) or check the files"
        )
    summary["train"] = {
        "read": read, "filtered": {k: v for k, v in rejected.items() if v}, "kept": writer.size,
        "src_tokens": writer.num_tokens["src"], "tgt_tokens": writer.num_tokens["tgt"],
        "invalid_utf8": stats.invalid_utf8,
    }

    # Validation and test sets are small; they are encoded as they are, in this process.
    plain_encoder = ChunkEncoder(src_model, tgt_model, tokenizer.eos_id, dtype.name, clean=None)
    for split in ("valid", "test"):
        stats = ReadStats()
        text = ParallelText()
        for src, tgt in source.pairs(split, stats):
            text.src.append(src)
            text.tgt.append(tgt)
        stats.report(split, log)
        if not text.src and split == "test" and cfg.splits.test is None:
            summary[split] = {"read": 0, "kept": 0, "src_tokens": 0, "tgt_tokens": 0, "invalid_utf8": 0}
            continue  # data.splits.test=null: no test split, nothing to store
        if not text.src:
            raise MtrainError(f"data: the {split} split of {source.description} has no sentences")
        writer = CorpusWriter(staging / split, dtype)
        for start_index in range(0, len(text), cfg.chunk_size):
            end = start_index + cfg.chunk_size
            chunk = plain_encoder(list(zip(text.src[start_index:end], text.tgt[start_index:end])))
            writer.append(chunk.src_tokens, chunk.src_lengths, chunk.tgt_tokens, chunk.tgt_lengths)
        writer.close()
        (staging / split / "text.json").write_text(
            json.dumps({"src": text.src, "tgt": text.tgt}, ensure_ascii=False), encoding="utf-8"
        )
        summary[split] = {
            "read": len(text), "kept": writer.size, "src_tokens": writer.num_tokens["src"],
            "tgt_tokens": writer.num_tokens["tgt"], "invalid_utf8": stats.invalid_utf8,
        }
    return summary


def _model_files(tokenizer: Tokenizer) -> tuple:
    """(source model, target model) paths: what a worker process needs to encode."""
    files = tokenizer.files
    if tokenizer.joint:
        return files[JOINT_MODEL], files[JOINT_MODEL]
    return files[SRC_MODEL], files[TGT_MODEL]


def _subset(chunk: EncodedChunk, keep: np.ndarray) -> EncodedChunk:
    """The pairs of `chunk` where `keep` is True."""
    return EncodedChunk(
        src_tokens=chunk.src_tokens[np.repeat(keep, chunk.src_lengths)],
        src_lengths=chunk.src_lengths[keep],
        tgt_tokens=chunk.tgt_tokens[np.repeat(keep, chunk.tgt_lengths)],
        tgt_lengths=chunk.tgt_lengths[keep],
        hashes=None,
        rejected=chunk.rejected,
    )


def _log_summary(summary: Dict[str, Any], log: Log) -> None:
    train = summary["train"]
    filtered = sum(train["filtered"].values())
    reasons = ", ".join(f"{reason} {count:,}" for reason, count in train["filtered"].items())
    log(
        f"data: train: {train['read']:,} pairs read, {filtered:,} filtered"
        f"{f' ({reasons})' if reasons else ''}, {train['kept']:,} kept; "
        f"tokens: src {train['src_tokens']:,}, tgt {train['tgt_tokens']:,}"
    )
    for split in ("valid", "test"):
        counts = summary[split]
        log(
            f"data: {split}: {counts['kept']:,} pairs; "
            f"tokens: src {counts['src_tokens']:,}, tgt {counts['tgt_tokens']:,}"
        )
