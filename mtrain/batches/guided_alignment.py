"""Guided alignment's targets: a Pharaoh file of word alignments, line for line with the
training corpus, as subword links per training pair and as per-batch target matrices.

The file (`train.guided_alignment`; e.g. scripts/align_eflomal.py) has one line per line of the
training corpus as read, before cleaning: `i-j` links of source word i to target word j, words
being whitespace-separated tokens (SentencePiece's `▁` pieces start them). Cleaning and
deduplication drop pairs; the cache entry keeps the corpus line of each kept pair
(`line.numbers`, mtrain.batches.training_set), so a kept pair finds its own line. A word link
becomes the links of all its pieces (source pieces x target pieces; Marian's mapping).

For a batch, `targets` gives (batch, tgt_len, src_len): row t of a pair is the normalised
distribution over the source pieces aligned to target piece t (zero rows for target pieces
with no link, for EOS and padding: they are not guided). Garg et al. (2019) train one head's
attention row towards it with a cross-entropy (mtrain.train.loss).

Refused before training, naming file and line: a line count other than the corpus's (or
fewer lines than train_limit reads), and a word index beyond the words of its line.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from mtrain.batches.corpus import EncodedCorpus
from mtrain.batches.training_set import line_numbers
from mtrain.errors import MtrainError
from mtrain.tokenizer import Tokenizer

WORD_START = "\u2581"


class GuidedAlignments:
    """Subword links of every training pair: pair k's are `src[offsets[k]:offsets[k+1]]`
    (source piece positions) with `tgt[...]` (target piece positions)."""

    def __init__(self, offsets: np.ndarray, src: np.ndarray, tgt: np.ndarray) -> None:
        self.offsets, self.src, self.tgt = offsets, src, tgt

    def targets(self, indices: np.ndarray, src_width: int, tgt_width: int) -> torch.Tensor:
        """(len(indices), tgt_width, src_width) float32: the row-normalised alignment matrix of
        each pair (index -1: a dummy row of shape buckets, all zero)."""
        matrix = np.zeros((len(indices), tgt_width, src_width), dtype=np.float32)
        for row, index in enumerate(indices):
            if index < 0:
                continue
            start, end = self.offsets[index], self.offsets[index + 1]
            matrix[row, self.tgt[start:end], self.src[start:end]] = 1.0
        sums = matrix.sum(axis=2, keepdims=True)
        np.divide(matrix, sums, out=matrix, where=sums > 0)
        return torch.from_numpy(matrix)


def word_starts(tokenizer: Tokenizer, side: str) -> np.ndarray:
    """(vocab,) bool: the pieces of `side` ("src"/"tgt") that start a word."""
    size = tokenizer.src_vocab_size if side == "src" else tokenizer.tgt_vocab_size
    pieces = (tokenizer.src_pieces if side == "src" else tokenizer.tgt_pieces)(range(size))
    return np.fromiter((piece.startswith(WORD_START) for piece in pieces), dtype=bool, count=size)


def read_alignment_file(
    path: str | Path, corpus: EncodedCorpus, entry: Path, key: str, train_limit: int | None = None
) -> tuple[list[str], np.ndarray]:
    """The lines of the Pharaoh file `path` (config key `train.KEY`) and, per pair of `corpus`
    (the training split stored in cache `entry`), its line; MtrainError when the file's line
    count is not the corpus's as read (more lines are allowed when train_limit stopped the
    reading early)."""
    path = Path(path)
    summary = json.loads((entry / "summary.json").read_text(encoding="utf-8"))["train"]
    kept_lines = line_numbers(entry)
    if len(kept_lines) != len(corpus):
        raise MtrainError(f"{entry}: the cache entry has no line numbers for its pairs; remove it to re-encode")
    lines = _pharaoh_text(path, key).split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    check_line_count(lines, str(path), int(summary["read"]), key, limited=train_limit is not None)
    return lines, kept_lines


def _pharaoh_text(path: Path, key: str) -> str:
    """The file's text; MtrainError naming `path:line` when it is not UTF-8 (a Pharaoh file is
    digits, dashes and spaces: such a file is most likely not the alignment file at all)."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise MtrainError(
            f"train.{key}: {path}:{line}: not valid UTF-8 ({error.reason} at byte {error.start}); give the "
            "Pharaoh word links (i-j pairs) of the training corpus, e.g. from scripts/align_eflomal.py"
        ) from None


def check_line_count(lines: list[str], name: str, read: int, key: str, limited: bool = False) -> None:
    if len(lines) < read or (len(lines) > read and not limited):
        raise MtrainError(
            f"train.{key}: {name} has {len(lines)} lines, the training corpus {read}; "
            "the file must be line for line with the corpus as read (before cleaning)"
        )


def parse_links(line: str, where: str, num_src: int, num_tgt: int, key: str) -> list[tuple[int, int]]:
    """The `i-j` links of one Pharaoh line (`where`: file:line) of a pair with `num_src` source
    and `num_tgt` target words; MtrainError naming `train.KEY` and `where` for a bad link."""
    links = []
    for token in line.split():
        i, dash, j = token.partition("-")
        if not dash or not i.isdigit() or not j.isdigit():
            raise MtrainError(f"train.{key}: {where}: {token!r} is not a Pharaoh link i-j")
        if int(i) >= num_src or int(j) >= num_tgt:
            raise MtrainError(
                f"train.{key}: {where}: link {token} is out of range: the pair has "
                f"{num_src} source and {num_tgt} target words (0-based indices)"
            )
        links.append((int(i), int(j)))
    return links


def words_of(tokens: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The word index of each piece (the first piece starts word 0 whatever it is)."""
    is_start = starts[tokens]
    if len(is_start):
        is_start[0] = True
    return np.cumsum(is_start) - 1


def word_count(words: np.ndarray) -> int:
    return int(words[-1]) + 1 if len(words) else 0


def load_guided_alignments(
    path: str | Path, corpus: EncodedCorpus, entry: Path, tokenizer: Tokenizer, train_limit: int | None = None
) -> GuidedAlignments:
    """The subword links of every pair of `corpus` (the training split stored in cache `entry`,
    read up to `train_limit` pairs) from the Pharaoh file `path`; MtrainError naming the file
    and line for a bad file."""
    lines, kept_lines = read_alignment_file(path, corpus, entry, "guided_alignment", train_limit)
    return guided_alignments_from(
        lines,
        str(path),
        corpus,
        kept_lines,
        len(lines),
        word_starts(tokenizer, "src"),
        word_starts(tokenizer, "tgt"),
        limited=True,
    )


def guided_alignments_from(
    lines: list[str],
    name: str,
    corpus: EncodedCorpus,
    kept_lines: np.ndarray,
    read: int,
    src_starts: np.ndarray,
    tgt_starts: np.ndarray,
    limited: bool = False,
) -> GuidedAlignments:
    """The subword links of `corpus`'s pairs from Pharaoh `lines` (of file `name`): pair k is
    line `kept_lines[k]`; `read` corpus lines were read (more lines are allowed when `limited`,
    train_limit having stopped the reading early); `src_starts`/`tgt_starts` say which token
    ids start a word."""
    check_line_count(lines, name, read, "guided_alignment", limited)
    offsets = np.zeros(len(corpus) + 1, dtype=np.int64)
    src_links: list[np.ndarray] = []
    tgt_links: list[np.ndarray] = []
    for k, line_index in enumerate(kept_lines.tolist()):
        src_words = words_of(corpus.src(k)[:-1], src_starts)  # without the eos
        tgt_words = words_of(corpus.tgt(k), tgt_starts)
        pairs_src, pairs_tgt = [], []
        where = f"{name}:{line_index + 1}"
        for i, j in parse_links(
            lines[line_index], where, word_count(src_words), word_count(tgt_words), "guided_alignment"
        ):
            src_pieces = np.flatnonzero(src_words == i)
            tgt_pieces = np.flatnonzero(tgt_words == j)
            pairs_src.append(np.repeat(src_pieces, len(tgt_pieces)))
            pairs_tgt.append(np.tile(tgt_pieces, len(src_pieces)))
        count = 0
        if pairs_src:
            src_links.append(np.concatenate(pairs_src))
            tgt_links.append(np.concatenate(pairs_tgt))
            count = len(src_links[-1])
        offsets[k + 1] = offsets[k] + count
    empty = np.zeros(0, dtype=np.int64)
    src = np.concatenate(src_links).astype(np.int64) if src_links else empty
    tgt = np.concatenate(tgt_links).astype(np.int64) if tgt_links else empty
    return GuidedAlignments(offsets, src, tgt)
