"""The validation and test sets of one direction, each encoded into its own cache entry.

They are encoded as they are (never filtered), with the direction's tags at the start of each
source (`<2xx>` with data.lang_tags), and kept as raw text for BLEU. An entry is keyed by the
tokenizer, the split's source fingerprint, the direction, the tag ids and the target prefix
(an M2M100/NLLB target-language token that starts every target), so changing
`data.splits.test` re-encodes that test set only (a few thousand sentences, in this process).
Entries live under `<cache>/eval/`, beside the training corpora's `<cache>/corpora/`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtrain.batches.corpus import CorpusWriter, EncodedCorpus, token_dtype
from mtrain.batches.encoding import ChunkEncoder
from mtrain.config import DataConfig
from mtrain.data.cache import build_entry, cache_root, fingerprint, is_complete
from mtrain.data.cleaning import normalizer
from mtrain.data.overlap import EvalHashes
from mtrain.data.sources import ParallelSource, ParallelText, ReadStats
from mtrain.data.tags import Direction
from mtrain.errors import MtrainError
from mtrain.tokenizer import Tokenizer

CACHE_FORMAT = 1  # bump when the stored layout or the encoding changes

Log = Callable[[str], Any]


@dataclass
class EvalSet:
    """One encoded evaluation split (None/empty when the split is switched off)."""

    corpus: EncodedCorpus | None
    text: ParallelText
    counts: dict[str, int]
    hashes: EvalHashes  # of the (normalised) text: for train–test overlap
    key: str


def eval_set(
    split: str,
    direction: Direction,
    source: ParallelSource,
    data: DataConfig,
    tokenizer: Tokenizer,
    model_files: tuple[str, str],
    tag_ids: list[int],
    log: Log,
    tgt_prefix: list[int] | None = None,
) -> EvalSet:
    """`split` (valid or test) of `direction` from its cache entry, encoded first if there is none."""
    if split == "test" and data.splits.test is None:  # no test split: nothing to read or store
        return EvalSet(
            None,
            ParallelText(),
            {"read": 0, "kept": 0, "src_tokens": 0, "tgt_tokens": 0, "invalid_utf8": 0},
            EvalHashes(),
            "no test split",
        )
    src, tgt = direction
    tgt_prefix = tgt_prefix or []
    key = fingerprint(
        "eval",
        CACHE_FORMAT,
        tokenizer.fingerprint,
        source.fingerprint(split),
        src,
        tgt,
        tag_ids,
        data.invalid_utf8,
        *([tgt_prefix] if tgt_prefix else []),  # (absent otherwise: native runs' entries keep their keys)
    )
    entry = cache_root(data.cache_dir) / "eval" / f"{data.name}-{src}-{tgt}-{split}-{key[:16]}"
    if not is_complete(entry):
        with build_entry(entry, log) as staging:
            _encode(staging, split, direction, source, data, tokenizer, model_files, tag_ids, log, tgt_prefix)
    stored = json.loads((entry / "text.json").read_text(encoding="utf-8"))
    text = ParallelText(stored["src"], stored["tgt"])
    counts = json.loads((entry / "summary.json").read_text(encoding="utf-8"))
    normalize = normalizer(data.clean.normalize)  # as the training pairs are hashed
    hashes = EvalHashes.of([normalize(s) for s in text.src], [normalize(t) for t in text.tgt])
    return EvalSet(EncodedCorpus.open(entry / split), text, counts, hashes, key)


def _encode(
    staging: Path,
    split: str,
    direction: Direction,
    source: ParallelSource,
    data: DataConfig,
    tokenizer: Tokenizer,
    model_files: tuple[str, str],
    tag_ids: list[int],
    log: Log,
    tgt_prefix: list[int],
) -> None:
    stats = ReadStats()
    text = ParallelText()
    for src, tgt in source.pairs(split, stats):
        text.src.append(src)
        text.tgt.append(tgt)
    stats.report(split, log)
    (staging / "text.json").write_text(
        json.dumps({"src": text.src, "tgt": text.tgt}, ensure_ascii=False), encoding="utf-8"
    )
    if not text.src:
        raise MtrainError(
            f"data: the {split} split of {source.description} ({direction[0]}->{direction[1]}) has no sentences"
        )
    dtype = token_dtype(max(tokenizer.src_vocab_size, tokenizer.tgt_vocab_size))
    encoder = ChunkEncoder(
        *model_files, tokenizer.eos_id, dtype.name, clean=None, src_prefix=tag_ids, tgt_prefix=tgt_prefix
    )
    writer = CorpusWriter(staging / split, dtype)
    for start in range(0, len(text), data.chunk_size):
        chunk = encoder(
            list(zip(text.src[start : start + data.chunk_size], text.tgt[start : start + data.chunk_size], strict=True))
        )
        writer.append(chunk.src_tokens, chunk.src_lengths, chunk.tgt_tokens, chunk.tgt_lengths)
    writer.close()
    counts = {
        "read": len(text),
        "kept": writer.size,
        "src_tokens": writer.num_tokens["src"],
        "tgt_tokens": writer.num_tokens["tgt"],
        "invalid_utf8": stats.invalid_utf8,
    }
    (staging / "summary.json").write_text(json.dumps(counts), encoding="utf-8")
