"""A source factor inside a source id: the layout a term-aware model's sources are written in.

A term-aware model (`model.term_factors=true`) reads, for each source piece, a factor saying
whether it is a plain piece, a word that has a term, or a piece of the term written after it
(Dinu et al. 2019). The factor travels inside the id, `piece + factor * source vocabulary
size`, so that batches, padding, masks and every decoding path carry it unchanged. Two sides
share this layout and nothing else: the term annotation that writes such sources
(mtrain.tokenizer.term_factors) and the source embedding that splits them again
(mtrain.model.embeddings), so it lives here, below both.
"""

from __future__ import annotations

from collections.abc import Sequence

PLAIN, TERM_SOURCE, TERM_TARGET = 0, 1, 2
FACTORS = 3  # the factor embedding's rows


def factored(piece: int, factor: int, vocab_size: int) -> int:
    """The source id of `piece` with `factor`."""
    return piece + factor * vocab_size


def split_ids(ids: Sequence[int], vocab_size: int) -> tuple[list[int], list[int]]:
    """Annotated source ids -> (pieces, factors); plain ids come back as they are, factor 0."""
    return [i % vocab_size for i in ids], [i // vocab_size for i in ids]


def is_annotated(ids: Sequence[int], vocab_size: int) -> bool:
    return any(i >= vocab_size for i in ids)
