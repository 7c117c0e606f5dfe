"""Build a *synonym glossary* for a German->English test set: common nouns mapped to another English
word than the one a model (and the reference) uses, as a client's house style would ask
(Hund -> canine, Mann -> gentleman, ...), with the words each term replaces in a third column
(for `mtrain eval`'s "usual translation kept beside the term"), and the references with those
words replaced by the terms (what window overlap and 1-TERm compare against).

    python scripts/synonym_terms.py --src test.de.gz --ref test.en.gz --out synonyms.tsv --ref-out test.synonyms.en

Each glossary source term matches as `translate terms=` matches it (whole words, case-sensitive);
in a sentence whose source holds it, the reference's first whole-word occurrence of one of the
replaced words (any case; its capital kept) becomes the term. A reference without one of them is
left as it is and counted. The reference-derived ("oracle") glossary is scripts/oracle_terms.py's.
"""

from __future__ import annotations

import argparse
import gzip
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mtrain.decode.requests.terminology import Glossary
from mtrain.evaluate.terminology import term_instances

# German noun -> (the glossary's English term, the words a model would use instead)
SYNONYMS = {
    "Hund": ("canine", ["dog"]),
    "Mann": ("gentleman", ["man", "guy"]),
    "Mädchen": ("lass", ["girl"]),
    "Gebäude": ("edifice", ["building"]),
    "Frau": ("lady", ["woman"]),
    "Junge": ("lad", ["boy"]),
    "Straße": ("roadway", ["street", "road"]),
    "Auto": ("automobile", ["car"]),
    "Kind": ("youngster", ["child", "kid"]),
    "Hemd": ("tunic", ["shirt"]),
}


def read_lines(path: str) -> list[str]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return [line.rstrip("\n") for line in handle]


def with_term(reference: str, replaced: list[str], term: str) -> str | None:
    """`reference` with its first whole-word occurrence of a `replaced` word made `term`; None if none."""
    pattern = re.compile(r"(?<!\w)(?:" + "|".join(re.escape(word) for word in replaced) + r")(?!\w)", re.IGNORECASE)
    match = pattern.search(reference)
    if match is None:
        return None
    word = term[0].upper() + term[1:] if match.group()[0].isupper() else term
    return reference[: match.start()] + word + reference[match.end() :]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", required=True, help="the test set's German sources (.gz or plain)")
    parser.add_argument("--ref", required=True, help="its English references")
    parser.add_argument("--out", required=True, help="the glossary to write (source<TAB>term<TAB>replaced words)")
    parser.add_argument("--ref-out", required=True, help="the references with the replaced words made the terms")
    args = parser.parse_args()

    sources, references = read_lines(args.src), read_lines(args.ref)
    glossary = Glossary.of({source: term for source, (term, _) in SYNONYMS.items()})
    matches = unchanged = 0
    modified = []
    for source, reference in zip(sources, references, strict=True):
        for source_term, term in term_instances(glossary, source):
            matches += 1
            changed = with_term(reference, SYNONYMS[source_term][1], term)
            unchanged += changed is None
            reference = changed or reference
        modified.append(reference)
    with open(args.out, "w", encoding="utf-8") as out:
        out.write("# synonym glossary (scripts/synonym_terms.py): source term, its term, the words it replaces\n")
        for source, (term, replaced) in SYNONYMS.items():
            out.write(f"{source}\t{term}\t{'|'.join(replaced)}\n")
    Path(args.ref_out).write_text("".join(line + "\n" for line in modified), encoding="utf-8")
    print(
        f"{len(SYNONYMS)} terms, {matches} source matches in {len(sources)} sentences; "
        f"{matches - unchanged} references now hold the term, {unchanged} had none of the replaced words "
        f"-> {args.out}, {args.ref_out}"
    )


if __name__ == "__main__":
    main()
