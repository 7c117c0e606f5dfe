"""Reserved tag symbols at the start of source sentences, and the directions a run trains.

Order of a source sentence: `<2xx>` (target language, with data.lang_tags), then a corpus's
`<tag>` (data.corpora[i].tag, e.g. `<bt>`), then the sentence's pieces, then eos. The tags are
user-defined symbols of the (joint) SentencePiece model, so each is one piece and a token of
the CTranslate2 export like any other.
"""

from __future__ import annotations

from mtrain.config import DataConfig

Direction = tuple[str, str]  # (source language, target language)


def lang_tag(lang: str) -> str:
    """The target-language symbol: `<2en>` (Johnson et al. 2017)."""
    return f"<2{lang}>"


def corpus_tag(tag: str) -> str:
    """A corpus's symbol: `<bt>` for tag `bt`."""
    return f"<{tag}>"


def corpus_direction(data: DataConfig, index: int) -> Direction:
    """The direction of data.corpora[index] (its src/tgt, or data's)."""
    corpus = data.corpora[index]
    return (corpus.src or data.src, corpus.tgt or data.tgt)


def run_directions(data: DataConfig) -> list[Direction]:
    """Every direction a run trains, in the order they first appear in data.corpora;
    [(data.src, data.tgt)] without corpora."""
    if not data.corpora:
        return [(data.src, data.tgt)]
    directions: list[Direction] = []
    for index in range(len(data.corpora)):
        direction = corpus_direction(data, index)
        if direction not in directions:
            directions.append(direction)
    return directions


def reserved_symbols(data: DataConfig) -> list[str]:
    """The tag symbols the tokenizer must hold as single pieces, sorted (a stable key)."""
    symbols: set[str] = set()
    if data.lang_tags:
        symbols.update(lang_tag(tgt) for _, tgt in run_directions(data))
    symbols.update(corpus_tag(corpus.tag) for corpus in data.corpora if corpus.tag)
    return sorted(symbols)


def source_tags(data: DataConfig, tgt: str, tag: str | None = None) -> list[str]:
    """The symbols that start a source sentence translated into `tgt` (from a corpus tagged `tag`)."""
    tags = [lang_tag(tgt)] if data.lang_tags else []
    return tags + ([corpus_tag(tag)] if tag else [])
