"""Word alignments from cross-attention, written in Pharaoh format (`i-j`: source word i is
aligned to target word j, both 0-based).

Decoding collects the cross-attention of the chosen hypotheses (the mechanism that draws the
attention pictures: `Hypothesis.attention`, one row per output token and EOS). Each target
piece is aligned to the source piece it attends to most (argmax over the source pieces, the
source's eos and a multilingual run's tags excluded), as fairseq's `--print-alignment` and
Marian's hard alignments do. At word level the links of the pieces are mapped to words and
merged: a word is what SentencePiece starts with `▁`, i.e. a whitespace-separated token of the
line, so word indices count `line.split()` tokens of the source and the output.

Which layer and heads: `decode.alignment_layer` and `decode.alignment_head` (measured in
docs/TRANSLATE.md, "Word alignments"); a run trained with guided alignment is read from the
head it trained (`train.guided_alignment_layer/head`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from mtrain.config import DEFAULT_ALIGNMENT_LAYER, AlignmentLevel, AlignmentRule, DecodeConfig, alignment_level
from mtrain.decode.search.hypothesis import Hypothesis
from mtrain.errors import MtrainError
from mtrain.source_factors import is_annotated
from mtrain.tokenizer import Tokenizer
from mtrain.tokenizer.term_factors import fold_term_columns

__all__ = ["Aligner", "AlignmentLevel", "alignment_level", "pharaoh", "resolve_alignment_source"]

log = logging.getLogger("mtrain")

WORD_START = "\u2581"  # SentencePiece's ▁: the piece starts a word


def word_indices(pieces: Sequence[str]) -> list[int]:
    """The word index of every piece, words counted as `text.split()` counts them: a piece
    starting with ▁ starts a new word, and a piece that is only ▁ (a space on its own) belongs
    to the word after it (-1 when no word follows)."""
    words, index, new_word = [], -1, True
    for piece in pieces:
        new_word |= piece.startswith(WORD_START)
        if piece.strip(WORD_START):
            if new_word or index < 0:
                index += 1
            new_word = False
            words.append(index)
        else:
            words.append(-2)  # filled below: the next word's index
    following = index + 1 if index >= 0 else -1
    for position in range(len(words) - 1, -1, -1):
        if words[position] == -2:
            words[position] = following if following <= index else -1
        else:
            following = words[position]
    return words


def piece_links(
    attention: Tensor,
    num_src: int,
    num_tgt: int,
    src_offset: int = 0,
    rule: AlignmentRule | str = AlignmentRule.source,
) -> list[tuple[int, int]]:
    """(source piece, target piece) links, sorted: by `rule`, each source piece to the target
    piece attending to it most (`source`), each target piece to the source piece it attends to
    most (`target`), or both (`union`). `attention` (>= num_tgt rows, src_len) holds the rows of
    the output pieces first (the EOS row after them is ignored); the source pieces are columns
    `src_offset .. src_offset + num_src` (tags before them and the eos after are ignored)."""
    if num_src == 0 or num_tgt == 0:
        return []
    matrix = attention[:num_tgt, src_offset : src_offset + num_src]  # (target pieces, source pieces)
    links: set[tuple[int, int]] = set()
    if rule in (AlignmentRule.source, AlignmentRule.union):
        links.update((source, target) for source, target in enumerate(matrix.argmax(dim=0).tolist()))
    if rule in (AlignmentRule.target, AlignmentRule.union):
        links.update((source, target) for target, source in enumerate(matrix.argmax(dim=1).tolist()))
    return sorted(links)


def to_words(
    links: Sequence[tuple[int, int]], src_pieces: Sequence[str], tgt_pieces: Sequence[str]
) -> list[tuple[int, int]]:
    """Piece links mapped to word links (sorted, each once; pieces of no word are dropped)."""
    src_words, tgt_words = word_indices(src_pieces), word_indices(tgt_pieces)
    return sorted({(src_words[i], tgt_words[j]) for i, j in links if src_words[i] >= 0 and tgt_words[j] >= 0})


def pharaoh(links: Sequence[tuple[int, int]]) -> str:
    """`0-0 1-2 ...`, sorted by source then target index."""
    return " ".join(f"{i}-{j}" for i, j in sorted(links))


def parse_pharaoh(line: str, where: str) -> list[tuple[int, int]]:
    """Links of a Pharaoh line (`i-j` pairs separated by spaces); `where` (file:line) names it
    in the error. Marian's and fast_align's `i-j` only; the `p`/`?` of possible links is refused."""
    links = []
    for token in line.split():
        source, dash, target = token.partition("-")
        if not dash or not source.isdigit() or not target.isdigit():
            raise MtrainError(f"{where}: {token!r} is not a Pharaoh link i-j (0-based source-target word indices)")
        links.append((int(source), int(target)))
    return links


@dataclass
class Aligner:
    """Fills `Hypothesis.alignment` from the attention decoding collected (`attention_layer`).

    With attention pictures asked for too (`picture_layer`), decoding collects every layer;
    the alignment reads its layer and the picture gets the layer(s) it asked for."""

    level: AlignmentLevel
    tokenizer: Tokenizer
    layer: int
    head: int | None
    picture_layer: int | str | None
    attention_layer: int | str  # what decoding collects: "all", "last", a layer, or "LAYER:HEAD"
    rule: AlignmentRule = AlignmentRule.source

    @classmethod
    def of(cls, cfg: DecodeConfig, tokenizer: Tokenizer, picture_layer: int | str | None) -> Aligner | None:
        """The aligner `cfg.alignment` asks for; None when it asks for none."""
        level = alignment_level(cfg.alignment)
        if level is AlignmentLevel.none:
            return None
        layer = DEFAULT_ALIGNMENT_LAYER if cfg.alignment_layer is None else cfg.alignment_layer
        head = cfg.alignment_head
        collect: int | str
        if picture_layer is not None:
            if head is not None:
                raise MtrainError(
                    f"decode.alignment_head={head} with attention pictures: decoding collects one kind of "
                    "attention; draw the pictures in a separate run, or leave alignment_head unset"
                )
            collect = "all"
        elif head is not None:
            collect = f"{layer}:{head}"
        else:
            collect = "last" if layer == -1 else layer  # "last": what CTranslate2 can give
        return cls(level, tokenizer, layer, head, picture_layer, collect, AlignmentRule(cfg.alignment_rule))

    def align(self, source_ids: Sequence[int], hyp: Hypothesis) -> None:
        """`hyp.alignment` from `hyp.attention`; `source_ids` end with eos and start with
        the tokenizer's `source_prefix` (a multilingual run's tags), which are not words."""
        attention = hyp.attention
        if attention is None:  # an empty output: nothing attended
            hyp.alignment = []
            return
        if self.picture_layer is not None:  # (tgt, layers, src): every layer was collected
            weights = attention[:, self.layer]
            if self.picture_layer != "all":
                hyp.attention = attention[:, -1 if self.picture_layer == "last" else int(self.picture_layer)]
        else:
            weights = attention
            hyp.attention = None  # not asked for: not kept
        vocab = self.tokenizer.src_vocab_size
        if is_annotated(source_ids, vocab):  # a term-aware model's source: its terms' columns folded in
            weights, source_ids = fold_term_columns(weights, source_ids, vocab)
        prefix = len(self.tokenizer.source_prefix)
        src_pieces = self.tokenizer.src_pieces(source_ids[prefix:-1])
        tgt_pieces = self.tokenizer.tgt_pieces(hyp.tokens)
        links = piece_links(weights, len(src_pieces), len(tgt_pieces), prefix, self.rule)
        hyp.alignment = links if self.level is AlignmentLevel.subword else to_words(links, src_pieces, tgt_pieces)


def resolve_alignment_source(
    decode: DecodeConfig, run_config: Any | None, ctranslate2: bool, used: bool = True
) -> None:
    """Fill `decode.alignment_layer`/`alignment_head` when both are null: a run trained with
    guided alignment aligns with its guided head (`train.guided_alignment_layer/head`);
    CTranslate2 gives the last layer's heads averaged (what `mtrain export` exports as its
    alignment layer); otherwise `Aligner` takes DEFAULT_ALIGNMENT_LAYER's average when both stay null.
    Filled whether or not `decode.alignment` asks (markup and serve's requests align too);
    `used`: alignments will be made, so a guided head CTranslate2 cannot read is warned about."""
    if decode.alignment_layer is not None or decode.alignment_head is not None:
        return
    train = getattr(run_config, "train", None) if run_config is not None else None
    guided = train is not None and getattr(train, "guided_alignment", None) is not None
    if ctranslate2:
        if guided and used:
            log.warning(
                "decode.alignment: this run trained guided alignment on one head, but CTranslate2 gives only "
                "the last layer's average of heads (less reliable); engine=torch aligns with the guided head"
            )
        decode.alignment_layer = -1
    elif guided:
        assert train is not None
        decode.alignment_layer = int(train.guided_alignment_layer)
        decode.alignment_head = int(train.guided_alignment_head)
