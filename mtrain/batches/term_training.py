"""Term-aware training data (`train.term_alignment`): sources annotated with terms from the pair itself.

Dinu et al. (2019) train a model to use terms by showing it sources in which some words carry
the target word(s) they are translated with; at decoding a glossary supplies them. Here the
terms come from the training pair's word alignments (a Pharaoh file line for line with the
corpus, as guided alignment reads it; scripts/align_eflomal.py):

- a candidate is a source word linked to one run of adjacent target words, none of which is
  linked to another source word (a clean 1-to-n link: `Hund`-`dog`, `Feuerwehrmann`-`fire
  fighter`), both sides holding a letter, and the source word not among the corpus's
  `train.term_skip_frequent` most frequent words (articles, prepositions: content words stay);
- in a share `train.term_rate` of the pairs (drawn with the run's seed, once), up to
  `train.term_max_words` candidates, drawn at random, get their target words, without the
  punctuation pieces at their ends, as the term;
- the annotated source is written by mtrain.tokenizer.term_factors (the one writer, also of
  decoding's glossary terms): term pieces re-encoded as the source tokenizer encodes a glossary
  term, so that training and decoding see a term alike.

The annotation is drawn once, when the run starts (the annotated corpus is held in memory, its
ids int32: a factor takes an id past the vocabulary), and it is reproducible from the seed.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mtrain.batches.corpus import EncodedCorpus
from mtrain.batches.guided_alignment import parse_links, read_alignment_file, word_count, word_starts, words_of
from mtrain.config import TrainConfig
from mtrain.tokenizer import Tokenizer
from mtrain.tokenizer.term_factors import annotate

log = logging.getLogger("mtrain")

KEY = "term_alignment"


@dataclass(frozen=True)
class TermAnnotation:
    """What the annotation did: pairs annotated, terms written, candidates there were."""

    pairs: int
    annotated: int
    terms: int
    candidates: int

    def summary(self) -> str:
        share = 100 * self.annotated / max(1, self.pairs)
        return (
            f"term annotation: {self.annotated} of {self.pairs} training pairs ({share:.1f}%) carry "
            f"{self.terms} terms ({self.candidates} candidate words)"
        )


def load_term_training(
    corpus: EncodedCorpus, entry: Path, tokenizer: Tokenizer, cfg: TrainConfig, seed: int, train_limit: int | None
) -> tuple[EncodedCorpus, TermAnnotation]:
    """`corpus` (the training split in cache `entry`) with its sources annotated as
    `cfg.term_*` say, from the alignment file `cfg.term_alignment`."""
    assert cfg.term_alignment is not None
    lines, kept_lines = read_alignment_file(cfg.term_alignment, corpus, entry, KEY, train_limit)
    return annotate_corpus(corpus, lines, str(cfg.term_alignment), kept_lines, tokenizer, cfg, seed)


def annotate_corpus(
    corpus: EncodedCorpus,
    lines: Sequence[str],
    name: str,
    kept_lines: np.ndarray,
    tokenizer: Tokenizer,
    cfg: TrainConfig,
    seed: int,
) -> tuple[EncodedCorpus, TermAnnotation]:
    """See the module docstring: pair k's links are `lines[kept_lines[k]]` (file `name`)."""
    src_starts, tgt_starts = word_starts(tokenizer, "src"), word_starts(tokenizer, "tgt")
    vocab = tokenizer.src_vocab_size
    src_words = [words_of(corpus.src(k)[:-1], src_starts) for k in range(len(corpus))]
    frequent = _frequent_words(corpus, src_words, tokenizer, cfg.term_skip_frequent)
    rng = np.random.default_rng(seed)
    chosen = rng.random(len(corpus)) < cfg.term_rate
    sources: list[np.ndarray] = []
    annotated = terms = candidates = 0
    term_pieces: dict[str, list[int]] = {}
    for k, line_index in enumerate(kept_lines.tolist()):
        src = np.asarray(corpus.src(k))
        if not chosen[k]:
            sources.append(src.astype(np.int32))
            continue
        tgt = np.asarray(corpus.tgt(k))
        tgt_words = words_of(tgt, tgt_starts)
        links = parse_links(
            lines[line_index], f"{name}:{line_index + 1}", word_count(src_words[k]), word_count(tgt_words), KEY
        )
        found = _candidates(links, src[:-1], src_words[k], tgt, tgt_words, tokenizer, frequent)
        candidates += len(found)
        if not found:
            sources.append(src.astype(np.int32))
            continue
        picked = rng.permutation(len(found))[: cfg.term_max_words]
        pairs = []
        for index in sorted(picked.tolist()):
            word, text = found[index]
            if text not in term_pieces:
                term_pieces[text] = tokenizer.encode_src(text)[len(tokenizer.source_prefix) :]
            pairs.append(([word], term_pieces[text]))
        word_of = [*src_words[k].tolist(), -1]  # the eos is no word
        sources.append(np.asarray(annotate(src.tolist(), word_of, pairs, vocab), dtype=np.int32))
        annotated += 1
        terms += len(pairs)
    lengths = np.fromiter((len(source) for source in sources), dtype=np.int64, count=len(sources))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tokens = np.concatenate(sources) if sources else np.zeros(0, dtype=np.int32)
    # the targets are the corpus's own arrays (memory-mapped), untouched
    result = EncodedCorpus(tokens, offsets, corpus.tgt_tokens, corpus.tgt_offsets)
    return result, TermAnnotation(len(corpus), annotated, terms, candidates)


def _frequent_words(corpus: EncodedCorpus, src_words: list[np.ndarray], tokenizer: Tokenizer, count: int) -> set[str]:
    """The `count` most frequent source words of the corpus (case-folded)."""
    if count == 0:
        return set()
    counts: Counter[str] = Counter()
    for k, words in enumerate(src_words):
        counts.update(_word_texts(corpus.src(k)[:-1], words, tokenizer))
    return {word for word, _ in counts.most_common(count)}


def _word_texts(pieces: np.ndarray, words: np.ndarray, tokenizer: Tokenizer) -> list[str]:
    """Each word's text, case-folded, without the punctuation at its ends (`Hund.` is `hund`)."""
    names = tokenizer.src_pieces(pieces.tolist())
    texts = [""] * word_count(words)
    for name, word in zip(names, words.tolist(), strict=True):
        texts[word] += name
    return [_strip_punctuation(text.replace("\u2581", "")).casefold() for text in texts]


def _candidates(
    links: list[tuple[int, int]],
    src: np.ndarray,
    src_words: np.ndarray,
    tgt: np.ndarray,
    tgt_words: np.ndarray,
    tokenizer: Tokenizer,
    frequent: set[str],
) -> list[tuple[int, str]]:
    """(source word, its term as text) for every clean 1-to-n link of a content word."""
    by_source: dict[int, list[int]] = {}
    sources_of_target: Counter[int] = Counter()
    for i, j in links:
        by_source.setdefault(i, []).append(j)
        sources_of_target[j] += 1
    source_texts = _word_texts(src, src_words, tokenizer)
    found = []
    for i, targets in sorted(by_source.items()):
        targets = sorted(set(targets))
        if targets != list(range(targets[0], targets[-1] + 1)) or any(sources_of_target[j] > 1 for j in targets):
            continue
        word = source_texts[i]
        if word in frequent or not any(ch.isalpha() for ch in word):
            continue
        pieces = [
            int(t) for t, w in zip(tgt.tolist(), tgt_words.tolist(), strict=True) if targets[0] <= w <= targets[-1]
        ]
        text = _strip_punctuation(tokenizer.decode_tgt(pieces))
        if any(ch.isalpha() for ch in text):
            found.append((i, text))
    return found


def _strip_punctuation(text: str) -> str:
    """The term without the punctuation its words carry at their ends (`building.` -> `building`)."""
    return text.strip().strip(".,;:!?\"'()[]«»„“”‚‘’-").strip()
