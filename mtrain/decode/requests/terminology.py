"""A terminology file (`terms=FILE.tsv`): where a source holds a term, its target term becomes
a constraint of that sentence's translation.

The file has one term per line, `source term<TAB>target term` (UTF-8; blank lines and lines
starting with `#` are skipped; a byte-order mark and CRLF line ends are read as Windows
editors mean them: `mtrain.decode.requests.text_files.read_text_lines`). An optional third field lists the
words the target term replaces (`Hund<TAB>canine<TAB>dog|dogs`): decoding avoids them in the
translation of a sentence that holds the term (`decode.term_avoid_replaced`, default true; each
word also capitalised; a word the term itself holds or starts with is not avoided), and `mtrain
eval` counts how often one of them stays beside the term (mtrain/evaluate/terminology.py). How
a source term is found in a sentence:

- whole words only: a term matches where it is neither preceded nor followed by a word
  character (a Unicode letter, digit or `_`), so `Hund` matches in `Der Hund bellt.` and in
  `(Hund)`, not in `Hundehütte` or `Haushund`; the spaces inside a multi-word term match any
  run of whitespace;
- case-sensitive (`Bank` is not `bank`), unless `terms_ignore_case=true`: then terms and
  sentences are compared case-folded (Unicode case folding: `STRASSE` matches `Straße`);
- leftmost first, and at one place the longest term: with `New York` and `New York City`
  both listed, `New York City` wins; a term inside or overlapping a matched one is not used;
- each target term is a constraint once per sentence however often its source appears
  (a listed source term with two targets is refused: which one would be meant?).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from mtrain.decode.requests.text_files import read_text_lines
from mtrain.errors import MtrainError


@dataclass(frozen=True)
class Glossary:
    """Source terms and their target terms, and the pattern that finds the source terms."""

    targets: dict[str, str]  # source term (case-folded with ignore_case) -> target term
    pattern: re.Pattern[str]
    ignore_case: bool = False
    # source term (keyed as in targets) -> the words its target term replaces (the third field)
    replaced: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def of(
        cls, terms: dict[str, str], ignore_case: bool = False, replaced: dict[str, list[str]] | None = None
    ) -> Glossary:
        replaced = replaced or {}
        if ignore_case:
            terms = {source.casefold(): target for source, target in terms.items()}
            replaced = {source.casefold(): words for source, words in replaced.items()}
        # Longest first: at one position the regex takes the first alternative that matches.
        alternatives = [
            r"\s+".join(re.escape(word) for word in source.split()) for source in sorted(terms, key=len, reverse=True)
        ]
        pattern = re.compile(r"(?<!\w)(?:" + "|".join(alternatives) + r")(?!\w)" if terms else r"(?!)")
        return cls(terms, pattern, ignore_case, replaced)

    def with_terms(self, pairs: list[tuple[str, str]]) -> Glossary:
        """This glossary and `pairs` (source term, target term), which win over its entries
        (a request's own terms over the server's). The words the server's terms replace stay
        with them; a request's pair has none."""
        added = {" ".join(source.split()): " ".join(target.split()) for source, target in pairs}
        if self.ignore_case:
            added = {source.casefold(): target for source, target in added.items()}
        kept = {source: words for source, words in self.replaced.items() if source not in added}
        return Glossary.of({**self.targets, **added}, self.ignore_case, kept)

    def _matches(self, source: str) -> Iterator[tuple[str, re.Match[str]]]:
        """Each source term found in `source`, as `targets` keys it, and its match (in the
        case-folded text with ignore_case: folding keeps the whitespace)."""
        for match in self.pattern.finditer(source.casefold() if self.ignore_case else source):
            yield " ".join(match.group().split()), match

    def term_words(self, source: str) -> dict[str, list[int]]:
        """Per target term found in `source`, the indices of the source words its source term
        covers (words as `source.split()` counts them; a word that holds the term, `(Hund)`, too)."""
        text = source.casefold() if self.ignore_case else source  # where _matches finds them
        starts = [word.start() for word in re.finditer(r"\S+", text)]
        found: dict[str, list[int]] = {}
        for key, match in self._matches(source):
            first = bisect.bisect_right(starts, match.start()) - 1
            last = bisect.bisect_left(starts, match.end()) - 1
            found.setdefault(self.targets[key], []).extend(range(first, last + 1))
        return found

    def replaced_in(self, source: str) -> dict[str, list[str]]:
        """Per target term found in `source`, the words it replaces (the third field), each also
        capitalised (a sentence's first word), without the words the term itself holds."""
        found: dict[str, list[str]] = {}
        for key, _ in self._matches(source):
            target = self.targets[key]
            # A word the term starts with is not avoided: avoided phrases are banned piece by piece, so
            # avoiding `road` would ban the first piece of `roadway` and the term could not be written.
            inside = target.casefold().split()
            words = [
                word
                for word in self.replaced.get(key, [])
                if not any(term.startswith(part) for part in word.casefold().split() for term in inside)
            ]
            found.setdefault(target, []).extend(
                dict.fromkeys(variant for word in words for variant in (word, word[:1].upper() + word[1:]))
            )
        return found

    def constraints(self, source: str) -> list[str]:
        """The target terms of the source terms in `source`, in their order, each once."""
        return list(dict.fromkeys(self.targets[key] for key, _ in self._matches(source)))


@dataclass
class TermTargets:
    """Source term -> target term as a glossary's entries come (a terms file's lines, a
    request's pairs), each source term with one target: given two, it is refused (which one
    would be meant?). Terms are compared with their whitespace runs as single spaces, and
    case-folded with `ignore_case`, as the glossary finds them."""

    ignore_case: bool = False
    targets: dict[str, str] = field(default_factory=dict)  # key (the source term as compared) -> target term
    places: dict[str, str] = field(default_factory=dict)  # key -> where it came: "on line 3", "in terms[0]"

    def add(self, source: str, target: str, where: str, place: str) -> str:
        """The key of `source` -> `target`, added; MtrainError naming `where` (this entry) and
        the other entry's `place` when `source` already has another target."""
        source, target = " ".join(source.split()), " ".join(target.split())
        key = source.casefold() if self.ignore_case else source
        if key in self.targets and self.targets[key] != target:
            raise MtrainError(
                f"{where}: {source!r} has the target {target!r} here and {self.targets[key]!r} "
                f"{self.places[key]}; keep one"
            )
        self.targets[key] = target
        self.places[key] = place
        return key


def glossary_of(
    base: Glossary | None, pairs: list[tuple[str, str]] | None, ignore_case: bool = False
) -> Glossary | None:
    """`base` (a server's glossary) with a request's term pairs; None when there is neither."""
    if not pairs:
        return base
    return (base or Glossary.of({}, ignore_case)).with_terms(pairs)


def read_glossary(path: str | Path, ignore_case: bool = False) -> Glossary:
    """The glossary in `path`; MtrainError naming the file and line for a malformed line."""
    terms = TermTargets(ignore_case)
    replaced: dict[str, list[str]] = {}
    for number, line in enumerate(read_text_lines(path, "terms"), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) not in (2, 3) or not fields[0].strip() or not fields[1].strip():
            raise MtrainError(
                f"terms={path} line {number}: expected `source term<TAB>target term` "
                f"(two non-empty fields, and optionally the words the term replaces, |-separated), "
                f"got {len(fields)} field(s)"
            )
        source = " ".join(fields[0].split())
        terms.add(source, fields[1], where=f"terms={path} line {number}", place=f"on line {number}")
        if len(fields) == 3:
            replaced[source] = [" ".join(word.split()) for word in fields[2].split("|") if word.strip()]
    return Glossary.of(terms.targets, ignore_case, replaced)
