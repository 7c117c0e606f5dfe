"""Filters for training pairs, as common in WMT pipelines, each counted under its own reason.

Applied to the training split only: validation and test sets are scored as they are. A pair
is counted under the first reason (in `REASONS` order) that rejects it:

- empty:        either side is empty (after trimming and normalisation)
- identical:    source == target (`data.clean.drop_identical`; untranslated copies)
- too_short:    either side has fewer than `min_len` subword tokens
- too_long:     either side has more than `max_len` subword tokens
- length_ratio: longer side / shorter side, in subword tokens, above `max_len_ratio`
- eval_overlap: the source side is in the validation or test split of the same direction
                (`data.clean.drop_eval_overlap`; mtrain.data.overlap)
- duplicate:    the same (source, target) pair was kept before (`data.clean.deduplicate`)

Token counts exclude the eos that the encoded corpus appends. Duplicates are found by a
64-bit hash of the normalised pair; the hashes seen so far are kept in a sorted numpy array
(8 bytes per kept pair) rather than a Python set, so WMT-size corpora stay small in memory.
"""

from __future__ import annotations

import hashlib
import unicodedata
from collections.abc import Callable, Sequence
from typing import Literal, cast

import numpy as np

from mtrain.config import CleanConfig, Normalization
from mtrain.errors import MtrainError

REASONS = ("empty", "identical", "too_short", "too_long", "length_ratio", "eval_overlap", "duplicate")
KEEP = 0  # reason code of a kept pair; reason REASONS[i] has code i + 1
_CODE = {reason: code for code, reason in enumerate(REASONS, start=1)}


def check_clean_config(cfg: CleanConfig) -> None:
    if cfg.normalize is not None and cfg.normalize not in tuple(Normalization):
        raise MtrainError(f"data.clean.normalize={cfg.normalize}: expected NFKC, NFC or null")
    if cfg.min_len < 0 or cfg.max_len < max(cfg.min_len, 1):
        raise MtrainError(f"data.clean: need 0 <= min_len <= max_len (got {cfg.min_len}, {cfg.max_len})")
    if cfg.max_len_ratio < 1.0:
        raise MtrainError(f"data.clean.max_len_ratio={cfg.max_len_ratio}: a ratio below 1 rejects everything")


def normalizer(form: str | None) -> Callable[[str], str]:
    """Unicode normalisation to `form` (NFKC, NFC), or the identity when null."""
    if form is None:
        return lambda text: text
    # unicodedata's stub takes the four form names as literals; it checks the name itself.
    unicode_form = cast(Literal["NFC", "NFD", "NFKC", "NFKD"], str(form))
    return lambda text: unicodedata.normalize(unicode_form, text)


def classify_pairs(
    src_texts: Sequence[str],
    tgt_texts: Sequence[str],
    src_lengths: np.ndarray,
    tgt_lengths: np.ndarray,
    cfg: CleanConfig,
) -> np.ndarray:
    """Reason code per pair (KEEP or 1 + index in REASONS), duplicates not yet considered.

    `cfg`: the `data.clean` settings (in an encoding worker, their plain copy: only attributes are read)."""
    codes = np.zeros(len(src_texts), dtype=np.uint8)

    def reject(reason: str, condition: np.ndarray) -> None:
        codes[(codes == KEEP) & condition] = _CODE[reason]

    reject("empty", np.fromiter((not s or not t for s, t in zip(src_texts, tgt_texts, strict=True)), bool, len(codes)))
    if cfg.drop_identical:
        reject("identical", np.fromiter((s == t for s, t in zip(src_texts, tgt_texts, strict=True)), bool, len(codes)))
    reject("too_short", np.minimum(src_lengths, tgt_lengths) < cfg.min_len)
    reject("too_long", np.maximum(src_lengths, tgt_lengths) > cfg.max_len)
    longer = np.maximum(src_lengths, tgt_lengths)
    shorter = np.maximum(np.minimum(src_lengths, tgt_lengths), 1)
    reject("length_ratio", longer / shorter > cfg.max_len_ratio)
    return codes


def reject_where(codes: np.ndarray, reason: str, condition: np.ndarray) -> None:
    """Give the kept pairs where `condition` holds the code of `reason` (in place)."""
    codes[(codes == KEEP) & condition] = _CODE[reason]


def count_reasons(codes: np.ndarray) -> dict[str, int]:
    counts = np.bincount(codes, minlength=len(REASONS) + 1)
    return {reason: int(counts[code]) for reason, code in _CODE.items()}


def pair_hashes(src_texts: Sequence[str], tgt_texts: Sequence[str]) -> np.ndarray:
    """64-bit hashes of (src, tgt) pairs; NUL never occurs in cleaned text, so it separates."""
    digests: list[int] = [
        int.from_bytes(hashlib.blake2b(f"{s}\x00{t}".encode(), digest_size=8).digest(), "little")
        for s, t in zip(src_texts, tgt_texts, strict=True)
    ]
    return np.array(digests, dtype=np.uint64)


class Deduplicator:
    """Remembers the hashes of kept pairs across chunks; only first occurrences survive."""

    def __init__(self) -> None:
        self.seen = np.empty(0, dtype=np.uint64)  # sorted

    def first_occurrences(self, hashes: np.ndarray) -> np.ndarray:
        """Bool mask over `hashes` (in corpus order): True for a pair not seen before."""
        unique, first_index = np.unique(hashes, return_index=True)
        position = np.searchsorted(self.seen, unique)
        already = np.zeros(len(unique), dtype=bool)
        inside = position < len(self.seen)
        already[inside] = self.seen[position[inside]] == unique[inside]
        keep = np.zeros(len(hashes), dtype=bool)
        keep[first_index[~already]] = True
        # Two sorted runs: the stable sort (timsort) merges them in linear time.
        self.seen = np.sort(np.concatenate([self.seen, unique[~already]]), kind="stable")
        return keep
