"""Term annotation of a source, as a term-aware model reads it (Dinu et al. 2019, "append").

A term-aware model (`model.term_factors=true`) is trained on sources where some words carry
the target term they must be translated with, written right after them, and a source factor
says which pieces are which:

    Ein  Mann  gentleman  sitzt ...      pieces
    0    1     2          0   ...        factor: PLAIN, TERM_SOURCE, TERM_TARGET

Training takes the terms from the pair itself (mtrain.batches.term_training); decoding from
the glossary (`terms=`, a request's terms; mtrain.decode.requests.pipeline), so both annotate alike:
this module is the one place that writes an annotated source.

The factor travels inside the source id, `piece + factor * source vocabulary size`
(mtrain.source_factors, the layout this module and the model share), so that batches, padding,
the encoder's masks and every decoding path carry it unchanged; the source embedding splits it
again (mtrain.model.embeddings) and adds a factor embedding, zero at first, so that a plain
model fine-tuned with factors starts out computing what it did.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mtrain.source_factors import PLAIN, TERM_SOURCE, TERM_TARGET, factored


def annotate(
    ids: Sequence[int], word_of: Sequence[int], terms: Sequence[tuple[Sequence[int], Sequence[int]]], vocab_size: int
) -> list[int]:
    """`ids` (plain source ids) with terms: each `(source words, term pieces)` of `terms` marks
    the pieces of its source words TERM_SOURCE and writes its term pieces, TERM_TARGET, after
    the last of them. `word_of[k]` is the word index of `ids[k]` (negative: no word, e.g. a
    language tag or the eos); a term whose words hold no piece is left out."""
    marked: dict[int, int] = {}  # source piece position -> the term it belongs to
    after: dict[int, list[int]] = {}  # last source piece position -> the term pieces written after it
    for index, (words, pieces) in enumerate(terms):
        wanted = set(words)
        positions = [k for k, word in enumerate(word_of) if word >= 0 and word in wanted]
        if not positions or not pieces or any(k in marked for k in positions):
            continue
        for k in positions:
            marked[k] = index
        after[positions[-1]] = list(pieces)
    out: list[int] = []
    for k, piece in enumerate(ids):
        out.append(factored(piece, TERM_SOURCE if k in marked else PLAIN, vocab_size))
        out.extend(factored(p, TERM_TARGET, vocab_size) for p in after.get(k, ()))
    return out


def source_positions(ids: Sequence[int], vocab_size: int) -> list[int]:
    """Per position of an annotated source, the source piece it stands for: itself, or for a
    term piece the source piece it was written after (alignments and pictures see the source
    as the user wrote it)."""
    origin, last = [], 0
    for k, i in enumerate(ids):
        if i // vocab_size != TERM_TARGET:
            last = k
        origin.append(last)
    return origin


def fold_term_columns(attention: torch.Tensor, ids: Sequence[int], vocab_size: int) -> tuple[torch.Tensor, list[int]]:
    """Attention over an annotated source (..., src_len) -> over its plain pieces: a term
    piece's weight is added to the source piece it was written after. Returns the folded
    attention and the plain source ids."""
    origin = source_positions(ids, vocab_size)
    kept = sorted(set(origin))
    column = {position: n for n, position in enumerate(kept)}
    # Columns past the source (a batch's padding) stay, after the folded ones.
    padding = range(len(ids), attention.shape[-1])
    targets = [column[o] for o in origin] + [len(kept) + n for n in range(len(padding))]
    index = torch.tensor(targets, device=attention.device)
    shape = (*attention.shape[:-1], len(kept) + len(padding))
    folded = torch.zeros(shape, dtype=attention.dtype, device=attention.device).index_add_(-1, index, attention)
    return folded, [ids[k] % vocab_size for k in kept]
