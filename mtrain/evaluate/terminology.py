"""Terminology metrics of a translated test set with a glossary: the WMT 2021 terminology task's
definitions (Alam et al. 2021, "On the Evaluation of Machine Translation for Terminology
Consistency"), and how often the usual translation stays beside a forced term.

A *term instance* is a glossary entry whose source term occurs in a sentence's source (matched as
`translate terms=` matches it: whole words, leftmost-longest; each target term once per sentence).
Texts are compared as words: runs of word characters and single punctuation marks, so `dog.`
holds the word `dog`.

- **exact-match term accuracy**: the share of instances whose target term occurs in the output,
  each occurrence counted for one instance only (a term needed twice must be there twice);
- **window overlap** (windows of 2 and 3): for an instance whose term occurs in both the reference
  and the output, the share of the reference's k words on each side of the term (punctuation
  skipped) found on each side of the output's term (each word once, occurrences paired
  one-to-one, best first); averaged per sentence, then over the sentences whose reference holds
  a term (a sentence whose output has none scores 0);
- **1-TERm**: one minus the mean edit rate of the outputs against the references (word
  insertions, deletions and substitutions over the reference's length) where an edit of a
  reference word that belongs to a term costs 2 instead of 1. Alam et al. run TER with shifts;
  this edit rate has none, so it is a little higher (worse) than theirs on reordered outputs;
- **usual translation kept beside the term**: of the instances whose term is in the output, the
  share where one of the words the term replaces (the glossary's optional third column,
  `|`-separated, e.g. `Hund<TAB>canine<TAB>dog|dogs`) is in the output too, outside the term.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mtrain.evaluate.tables import Table

if TYPE_CHECKING:  # (mtrain.decode's package imports torch; a report needs none)
    from mtrain.decode.requests.terminology import Glossary

WORD = re.compile(r"\w+|[^\w\s]")
TERM_WEIGHT = 2  # the cost of editing a reference word inside a term (Alam et al. 2021)
WINDOWS = (2, 3)


def words(text: str, ignore_case: bool = False) -> list[str]:
    return WORD.findall(text.casefold() if ignore_case else text)


def is_punctuation(word: str) -> bool:
    return not any(character.isalnum() for character in word)


def occurrences(needle: Sequence[str], haystack: Sequence[str]) -> list[int]:
    """Start positions of `needle` as a run of whole words in `haystack`."""
    width = len(needle)
    return [
        start for start in range(len(haystack) - width + 1) if list(haystack[start : start + width]) == list(needle)
    ]


def term_instances(glossary: Glossary, source: str) -> list[tuple[str, str]]:
    """The (source term, target term) pairs of `glossary` found in `source`, as `translate terms=`
    finds them: each target term once, in the order of its first source term."""
    found: dict[str, str] = {}
    for match in glossary.pattern.finditer(source.casefold() if glossary.ignore_case else source):
        key = " ".join(match.group().split())
        found.setdefault(glossary.targets[key], key)
    return [(source_term, target) for target, source_term in found.items()]


def _window(tokens: Sequence[str], start: int, end: int, size: int) -> list[str]:
    """Up to `size` non-punctuation words before `start` and after `end` (exclusive)."""
    before = [word for word in reversed(tokens[:start]) if not is_punctuation(word)][:size]
    after = [word for word in tokens[end:] if not is_punctuation(word)][:size]
    return before + after


def _window_overlap(term: list[str], hyp: list[str], ref: list[str], size: int) -> tuple[float, int] | None:
    """Summed overlaps and pairs of one term's reference and output occurrences, paired one to one
    (best first); None when the reference does not hold the term."""
    ref_starts = occurrences(term, ref)
    if not ref_starts:
        return None
    hyp_starts = occurrences(term, hyp)
    pairs = []
    for r, ref_start in enumerate(ref_starts):
        ref_window = _window(ref, ref_start, ref_start + len(term), size)
        for h, hyp_start in enumerate(hyp_starts):
            hyp_window = Counter(_window(hyp, hyp_start, hyp_start + len(term), size))
            shared = sum(min(count, hyp_window[word]) for word, count in Counter(ref_window).items())
            pairs.append((shared / len(ref_window) if ref_window else 0.0, r, h))
    total, paired, used_ref, used_hyp = 0.0, 0, set(), set()
    for overlap, r, h in sorted(pairs, key=lambda pair: -pair[0]):
        if r not in used_ref and h not in used_hyp:
            used_ref.add(r)
            used_hyp.add(h)
            total += overlap
            paired += 1
    return total, paired


def weighted_edit_rate(hyp: Sequence[str], ref: Sequence[str], weights: Sequence[int]) -> float:
    """Word edit distance of `hyp` to `ref` over the reference's length, where deleting or
    substituting reference word j costs weights[j] and an insertion costs 1."""
    previous = [0.0]
    for weight in weights:
        previous.append(previous[-1] + weight)
    for word in hyp:
        current = [previous[0] + 1]
        for j, ref_word in enumerate(ref):
            substitute = previous[j] + (0 if ref_word == word else weights[j])
            current.append(min(substitute, previous[j + 1] + 1, current[j] + weights[j]))
        previous = current
    return previous[-1] / max(len(ref), 1)


@dataclass
class TermScores:
    instances: int  # glossary matches in the sources
    sentences_with_terms: int
    exact_match: float  # share of instances whose term is in the output
    window_overlap: dict[int, float]  # window size -> overlap
    one_minus_term: float  # 1-TERm
    kept_beside: float | None  # share of found terms with their usual translation beside; None: no usual words
    kept_beside_instances: int  # found instances with usual words known

    def as_dict(self) -> dict[str, float | int | None]:
        return {
            "term_instances": self.instances,
            "sentences_with_terms": self.sentences_with_terms,
            "exact_match_accuracy": self.exact_match,
            **{f"window_overlap_{size}": value for size, value in self.window_overlap.items()},
            "one_minus_term": self.one_minus_term,
            "usual_kept_beside": self.kept_beside,
            "usual_kept_beside_instances": self.kept_beside_instances,
        }


def score_terms(
    glossary: Glossary,
    sources: Sequence[str],
    hypotheses: Sequence[str],
    references: Sequence[str],
) -> TermScores:
    """The terminology metrics of `hypotheses` against `references` (see the module's docstring)."""
    ignore_case = glossary.ignore_case
    instances = found = kept = kept_known = sentences_with_terms = 0
    window_sums = dict.fromkeys(WINDOWS, 0.0)
    window_sentences = 0
    edit_rates = []
    for source, hypothesis, reference in zip(sources, hypotheses, references, strict=True):
        hyp, ref = words(hypothesis, ignore_case), words(reference, ignore_case)
        pairs = term_instances(glossary, source)
        weights = [1] * len(ref)
        claimed: set[int] = set()
        sentence_windows: dict[int, list[tuple[float, int]]] = {size: [] for size in WINDOWS}
        for source_term, target in pairs:
            term = words(target, ignore_case)
            instances += 1
            for start in occurrences(term, ref):
                weights[start : start + len(term)] = [TERM_WEIGHT] * len(term)
            starts = [start for start in occurrences(term, hyp) if start not in claimed]
            if starts:
                found += 1
                claimed.add(starts[0])
                covered = {i for start in occurrences(term, hyp) for i in range(start, start + len(term))}
                replaced = [words(word, ignore_case) for word in glossary.replaced.get(source_term, [])]
                if replaced:
                    kept_known += 1
                    kept += any(
                        any(not covered & set(range(s, s + len(word))) for s in occurrences(word, hyp))
                        for word in replaced
                        if word and word != term
                    )
            for size in WINDOWS:
                overlap = _window_overlap(term, hyp, ref, size)
                if overlap is not None:
                    sentence_windows[size].append(overlap)
        sentences_with_terms += bool(pairs)
        if sentence_windows[WINDOWS[0]]:
            window_sentences += 1
            for size in WINDOWS:
                total = sum(part for part, _ in sentence_windows[size])
                paired = sum(count for _, count in sentence_windows[size])
                window_sums[size] += total / paired if paired else 0.0
        edit_rates.append(weighted_edit_rate(hyp, ref, weights))
    return TermScores(
        instances=instances,
        sentences_with_terms=sentences_with_terms,
        exact_match=found / instances if instances else 0.0,
        window_overlap={size: window_sums[size] / window_sentences if window_sentences else 0.0 for size in WINDOWS},
        one_minus_term=1.0 - sum(edit_rates) / max(len(edit_rates), 1),
        kept_beside=kept / kept_known if kept_known else None,
        kept_beside_instances=kept_known,
    )


@dataclass(frozen=True)
class GlossaryFile:
    """A glossary and the file it was read from (`mtrain eval terms=FILE.tsv`)."""

    path: str
    glossary: Glossary

    def record(self, sources: Sequence[str], hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, object]:
        """The report's `terms` section: the glossary scored with, and the metrics of
        `hypotheses` against one reference stream (the WMT21 definitions take one)."""
        scores = score_terms(self.glossary, sources, hypotheses, references)
        return {"glossary": self.path, "ignore_case": self.glossary.ignore_case, **scores.as_dict()}


def terms_table(record: dict[str, object]) -> Table:
    """The terminology metrics of a report's `terms` section as a table (shares in %, as BLEU's scale)."""

    def percent(value: object) -> float | None:
        return None if value is None else 100 * float(value)  # type: ignore[arg-type]

    table = Table(["term metric", "score", "of"])
    instances = f"{record['term_instances']} term(s) in {record['sentences_with_terms']} sentence(s)"
    table.add("exact-match term accuracy", percent(record["exact_match_accuracy"]), instances)
    for size in WINDOWS:
        table.add(f"window overlap {size}", percent(record[f"window_overlap_{size}"]), "references holding a term")
    table.add("1-TERm", percent(record["one_minus_term"]), "all sentences")
    table.add(
        "usual translation kept beside",
        percent(record["usual_kept_beside"]),
        f"{record['usual_kept_beside_instances']} produced term(s) with their usual words listed"
        if record["usual_kept_beside"] is not None
        else "no produced term has its usual words listed (the glossary's third field)",
    )
    return table
