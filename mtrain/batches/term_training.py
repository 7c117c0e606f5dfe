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
- a share `train.term_replace_rate` of those terms is another term instead, drawn from all
  candidates' distinct terms of the corpus, each as likely, of a capitalised source word's (a
  German noun's) for such a word (`dog` -> `tricycle`), and the target's words are replaced by
  it too. A term equal to the model's own translation can be ignored at no cost (a fine-tune
  with such terms alone learned to write `A dog runs` for `Hund canine`: term accuracy 0%
  without constraints); a term the target can only get from the source's annotation teaches
  the model to write the given term where it would write its own word, and not beside it
  (what a glossary of synonyms needs: `Hund`->`canine`);
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
from mtrain.errors import MtrainError
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
    replaced: int = 0  # terms that replaced their target words by another term
    drawn: int = 0  # pairs drawn (train.term_rate) to get terms, with a candidate or not
    links: int = 0  # the word links of the drawn pairs

    def summary(self) -> str:
        share = 100 * self.annotated / max(1, self.pairs)
        return (
            f"term annotation: {self.annotated} of {self.pairs} training pairs ({share:.1f}%) carry "
            f"{self.terms} terms ({self.candidates} candidate words), {self.replaced} of them replacing "
            "their target words by another term"
        )


def load_term_training(
    corpus: EncodedCorpus, entry: Path, tokenizer: Tokenizer, cfg: TrainConfig, seed: int, train_limit: int | None
) -> tuple[EncodedCorpus, TermAnnotation]:
    """`corpus` (the training split in cache `entry`) with its sources annotated as
    `cfg.term_*` say, from the alignment file `cfg.term_alignment`."""
    assert cfg.term_alignment is not None
    lines, kept_lines = read_alignment_file(cfg.term_alignment, corpus, entry, KEY, train_limit)
    annotated, annotation = annotate_corpus(corpus, lines, str(cfg.term_alignment), kept_lines, tokenizer, cfg, seed)
    check_some_terms(annotation, cfg)
    return annotated, annotation


def check_some_terms(annotation: TermAnnotation, cfg: TrainConfig) -> None:
    """Refuse a term-aware run whose annotation wrote no term: it would train a plain model
    that never sees a term, and say so only in a number of its log."""
    if annotation.terms:
        return
    if annotation.drawn == 0:
        raise MtrainError(
            f"train.term_rate={cfg.term_rate}: drew none of the {annotation.pairs} training pairs, so no source "
            "would carry a term; raise train.term_rate (e.g. 0.8), or drop train.term_alignment for a plain run"
        )
    raise MtrainError(
        f"train.term_alignment: {cfg.term_alignment}: 0 candidate words (a content word linked alone to adjacent "
        f"target words) in the {annotation.drawn} pairs drawn ({annotation.links} links in all), so no source "
        "would carry a term; give the corpus's word links (scripts/align_eflomal.py), or lower "
        f"train.term_skip_frequent={cfg.term_skip_frequent}"
    )


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
    chosen = np.flatnonzero(rng.random(len(corpus)) < cfg.term_rate)
    found_of: dict[int, list[Candidate]] = {}
    links_drawn = 0
    for k in chosen.tolist():
        line_index = int(kept_lines[k])
        src, tgt = np.asarray(corpus.src(k)), np.asarray(corpus.tgt(k))
        tgt_words = words_of(tgt, tgt_starts)
        where = f"{name}:{line_index + 1}"
        links = parse_links(lines[line_index], where, word_count(src_words[k]), word_count(tgt_words), KEY)
        links_drawn += len(links)
        found_of[k] = _candidates(links, src[:-1], src_words[k], tgt, tgt_words, tokenizer, frequent)
    # The replacements: the distinct terms of words of one kind (a capitalised source word's, a
    # German noun's, is replaced by another such term, so that a noun's place gets a noun), each
    # as likely: rare words, of several pieces, are most of them, and the model learns to copy
    # any term piece by piece (drawn by frequency, `man`, `shirt` dominate and it learned to copy
    # those only: `Hund canine` still gave `dog`).
    pools: dict[bool, list[str]] = {True: [], False: []}
    for capital in pools:
        texts = {candidate.text for found in found_of.values() for candidate in found if candidate.capital == capital}
        pools[capital] = sorted(texts)
    sources: list[np.ndarray] = [np.asarray(corpus.src(k)) for k in range(len(corpus))]
    targets: dict[int, np.ndarray] = {}  # the pairs whose target words a term replaced
    annotated = terms = replaced = 0
    term_pieces: dict[str, list[int]] = {}
    for k, found in found_of.items():
        if not found:
            continue
        chosen_terms: list[tuple[Candidate, str]] = []
        for index in sorted(rng.permutation(len(found))[: cfg.term_max_words].tolist()):
            candidate = found[index]
            text = candidate.text
            pool = pools[candidate.capital]
            if rng.random() < cfg.term_replace_rate:
                text = pool[int(rng.integers(len(pool)))]
                replaced += text != candidate.text
            chosen_terms.append((candidate, text))
        if any(text != candidate.text for candidate, text in chosen_terms):
            targets[k] = _replaced_target(np.asarray(corpus.tgt(k)), chosen_terms, tokenizer)
        pairs = []
        for candidate, text in chosen_terms:
            if text not in term_pieces:
                term_pieces[text] = tokenizer.encode_src(text)[len(tokenizer.source_prefix) :]
            pairs.append(([candidate.word], term_pieces[text]))
        word_of = [*src_words[k].tolist(), -1]  # the eos is no word
        sources[k] = np.asarray(annotate(sources[k].tolist(), word_of, pairs, vocab))
        annotated += 1
        terms += len(pairs)
    src_tokens, src_offsets = _packed(sources)
    if targets:
        tgt_tokens, tgt_offsets = _packed([targets.get(k, np.asarray(corpus.tgt(k))) for k in range(len(corpus))])
    else:  # the corpus's own arrays (memory-mapped), untouched
        tgt_tokens, tgt_offsets = corpus.tgt_tokens, corpus.tgt_offsets
    result = EncodedCorpus(src_tokens, src_offsets, tgt_tokens, tgt_offsets)
    candidates = sum(len(found) for found in found_of.values())
    return result, TermAnnotation(len(corpus), annotated, terms, candidates, replaced, len(chosen), links_drawn)


def _packed(sequences: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter((len(sequence) for sequence in sequences), dtype=np.int64, count=len(sequences))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tokens = np.concatenate(sequences).astype(np.int32) if sequences else np.zeros(0, dtype=np.int32)
    return tokens, offsets


def _replaced_target(tgt: np.ndarray, terms: list[tuple[Candidate, str]], tokenizer: Tokenizer) -> np.ndarray:
    """The target ids with each candidate's words holding its (replacement) term instead of its
    own, the punctuation at their ends kept, encoded again as a target sentence."""
    parts, position = [], 0
    for candidate, text in sorted(terms, key=lambda pair: pair[0].start):
        parts.append(tokenizer.decode_tgt(tgt[position : candidate.start].tolist()))
        words = tokenizer.decode_tgt(tgt[candidate.start : candidate.end].tolist())
        if candidate.text[:1].isupper() and not text[:1].isupper():
            text = text[:1].upper() + text[1:]  # a sentence's first word keeps its capital
        parts.append(words.replace(candidate.text, text, 1))
        position = candidate.end
    parts.append(tokenizer.decode_tgt(tgt[position:].tolist()))
    return np.asarray(tokenizer.encode_tgt(" ".join(part for part in parts if part)), dtype=np.int32)


def _frequent_words(corpus: EncodedCorpus, src_words: list[np.ndarray], tokenizer: Tokenizer, count: int) -> set[str]:
    """The `count` most frequent source words of the corpus (case-folded)."""
    if count == 0:
        return set()
    counts: Counter[str] = Counter()
    for k, words in enumerate(src_words):
        counts.update(_word_texts(corpus.src(k)[:-1], words, tokenizer))
    return {word for word, _ in counts.most_common(count)}


def _word_texts(pieces: np.ndarray, words: np.ndarray, tokenizer: Tokenizer, fold: bool = True) -> list[str]:
    """Each word's text, case-folded (`fold`), without the punctuation at its ends (`Hund.` is `hund`)."""
    names = tokenizer.src_pieces(pieces.tolist())
    texts = [""] * word_count(words)
    for name, word in zip(names, words.tolist(), strict=True):
        texts[word] += name
    stripped = [_strip_punctuation(text.replace("\u2581", "")) for text in texts]
    return [text.casefold() for text in stripped] if fold else stripped


@dataclass(frozen=True)
class Candidate:
    """A source word that may get a term: its index, its term (the target words it is linked to,
    as text, without the punctuation at their ends) and the target pieces they span [start, end)."""

    word: int
    text: str
    start: int
    end: int
    capital: bool  # the source word is capitalised inside the sentence (in German: a noun)


def _candidates(
    links: list[tuple[int, int]],
    src: np.ndarray,
    src_words: np.ndarray,
    tgt: np.ndarray,
    tgt_words: np.ndarray,
    tokenizer: Tokenizer,
    frequent: set[str],
) -> list[Candidate]:
    """Every clean 1-to-n link of a content word."""
    by_source: dict[int, list[int]] = {}
    sources_of_target: Counter[int] = Counter()
    for i, j in links:
        by_source.setdefault(i, []).append(j)
        sources_of_target[j] += 1
    cased = _word_texts(src, src_words, tokenizer, fold=False)
    source_texts = [text.casefold() for text in cased]
    found = []
    for i, targets in sorted(by_source.items()):
        targets = sorted(set(targets))
        if targets != list(range(targets[0], targets[-1] + 1)) or any(sources_of_target[j] > 1 for j in targets):
            continue
        word = source_texts[i]
        if word in frequent or not any(ch.isalpha() for ch in word):
            continue
        span = np.flatnonzero((tgt_words >= targets[0]) & (tgt_words <= targets[-1]))
        text = _strip_punctuation(tokenizer.decode_tgt(tgt[span].tolist()))
        if any(ch.isalpha() for ch in text):
            capital = i > 0 and cased[i][:1].isupper()
            found.append(Candidate(i, text, int(span[0]), int(span[-1]) + 1, capital))
    return found


def _strip_punctuation(text: str) -> str:
    """The term without the punctuation its words carry at their ends (`building.` -> `building`)."""
    return text.strip().strip(".,;:!?\"'()[]«»„“”‚‘’-").strip()
