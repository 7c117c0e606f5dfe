"""Build an "oracle terms" glossary for a test set from its sources and references (the
protocol of the WMT 2021/2023 terminology tasks' oracle setting), for `mtrain translate terms=`.

    python scripts/oracle_terms.py --src test.de.gz --ref test.en.gz --hyp baseline.en \
        --train-src train.de.gz --train-tgt train.en.gz --out terms.tsv

1. Words: `\\w+` runs and single punctuation marks; aligned lowercased. The test pairs are
   aligned with eflomal together with the training pairs (more text, better statistics);
   the forward and reverse links are intersected (precise 1-1 links).
2. Candidate pairs per test sentence: a source word linked only to one reference word and
   back, both alphabetic, 4+ characters, neither a stop word nor the sentence's first word,
   the source word capitalised (a German noun) and the reference word lowercase (an English
   noun inside a sentence); each word once in its sentence.
3. Per sentence up to `--per-sentence` pairs, those whose target word the baseline output
   (`--hyp`, beam 5) lacks first (the terms the model does not produce by itself), then the
   others, longest source word first.
4. The glossary maps each source word to one target word: where the chosen pairs disagree,
   the most frequent target (ties: the first seen). It then applies to every sentence whose
   source holds the word (not only the one it came from), as a client's glossary would.
   `--sentence-out FILE` also writes each sentence's own chosen target words, one line per
   test sentence, tab-separated (the terminology tasks' per-sentence oracle terms; for
   `mtrain translate constraints=unordered` after a tab behind each source), and
   `--sentence-pairs-out FILE` the same as source<TAB>target pairs (a request's own `terms`,
   which a term-aware model also writes into its source: scripts/bench_sentence_terms.py).
"""

from __future__ import annotations

import argparse
import gzip
import re
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

WORD = re.compile(r"\w+|[^\w\s]")
# Function words that are never terms (the filters below keep 4+ letter words only).
STOP_WORDS_DE = (
    "aber alle auch dass dem den der des die eine einem einen einer eines etwas hier ihre ihrem ihren noch oder "
    "sehr sich sind über unter vor während wird zwei drei vier viele andere anderen nach neben zwischen hinter "
    "gegen durch ohne diese diesem dieser dieses einige mehrere"
)
STOP_WORDS_EN = (
    "that this with from there their they them have what when where which while into onto over under some other "
    "others another about after before near next through three four many several these those each being been "
    "were does down just only very"
)
STOP = {"de": set(STOP_WORDS_DE.split()), "en": set(STOP_WORDS_EN.split())}


def read_lines(path: str) -> list[str]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return [line.rstrip("\n") for line in handle]


def words(line: str) -> list[str]:
    return WORD.findall(line)


def align(src: list[list[str]], tgt: list[list[str]]) -> list[set[tuple[int, int]]]:
    """Intersected forward/reverse eflomal links per sentence pair."""
    import eflomal

    with tempfile.TemporaryDirectory() as tmp:
        src_file, tgt_file = Path(tmp) / "src.txt", Path(tmp) / "tgt.txt"
        src_file.write_text("".join(" ".join(w.lower() for w in s) + "\n" for s in src), encoding="utf-8")
        tgt_file.write_text("".join(" ".join(w.lower() for w in t) + "\n" for t in tgt), encoding="utf-8")
        fwd, rev = Path(tmp) / "fwd", Path(tmp) / "rev"
        aligner = eflomal.Aligner(n_samplers=2)
        with src_file.open(encoding="utf-8") as s, tgt_file.open(encoding="utf-8") as t:
            aligner.align(s, t, links_filename_fwd=str(fwd), links_filename_rev=str(rev), quiet=True)
        links = []
        for f, r in zip(fwd.read_text().splitlines(), rev.read_text().splitlines(), strict=True):
            pairs_f = {tuple(map(int, link.split("-"))) for link in f.split()}
            pairs_r = {tuple(map(int, link.split("-"))) for link in r.split()}
            links.append({(a, b) for a, b in pairs_f & pairs_r})
        return links


def candidates(src: list[str], ref: list[str], links: set[tuple[int, int]], src_lang: str, tgt_lang: str):
    src_count, ref_count = Counter(src), Counter(ref)
    by_src, by_ref = Counter(a for a, _ in links), Counter(b for _, b in links)
    for i, j in sorted(links):
        s, t = src[i], ref[j]
        if by_src[i] != 1 or by_ref[j] != 1 or i == 0 or j == 0:
            continue
        if not (s.isalpha() and t.isalpha() and len(s) >= 4 and len(t) >= 4):
            continue
        if s.lower() in STOP[src_lang] or t.lower() in STOP[tgt_lang] or src_count[s] > 1 or ref_count[t] > 1:
            continue
        if s[0].isupper() and t.islower():
            yield s, t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", required=True)
    parser.add_argument("--ref", required=True)
    parser.add_argument("--hyp", help="the baseline output: terms it lacks are taken first")
    parser.add_argument("--train-src")
    parser.add_argument("--train-tgt")
    parser.add_argument("--src-lang", default="de")
    parser.add_argument("--tgt-lang", default="en")
    parser.add_argument("--per-sentence", type=int, default=2)
    parser.add_argument("--out", required=True)
    parser.add_argument("--sentence-out", help="each sentence's own target terms, tab-separated, one line each")
    parser.add_argument(
        "--sentence-pairs-out",
        help="each sentence's own terms as source<TAB>target pairs, tab-separated, one line each "
        "(a request's `terms`: scripts/bench_sentence_terms.py)",
    )
    args = parser.parse_args()

    src = [words(line) for line in read_lines(args.src)]
    ref = [words(line) for line in read_lines(args.ref)]
    hyp = [set(words(line)) for line in read_lines(args.hyp)] if args.hyp else [set() for _ in src]
    extra_src = [words(line) for line in read_lines(args.train_src)] if args.train_src else []
    extra_tgt = [words(line) for line in read_lines(args.train_tgt)] if args.train_tgt else []
    links = align(src + extra_src, ref + extra_tgt)[: len(src)]

    targets: dict[str, Counter[str]] = defaultdict(Counter)
    first_seen: dict[str, list[str]] = defaultdict(list)
    chosen = missing = 0
    per_sentence: list[list[str]] = []
    sentence_pairs: list[list[tuple[str, str]]] = []
    for s, r, h, link in zip(src, ref, hyp, links, strict=True):
        pairs = sorted(set(candidates(s, r, link, args.src_lang, args.tgt_lang)), key=lambda p: (p[1] in h, -len(p[0])))
        per_sentence.append([target for _, target in pairs[: args.per_sentence]])
        sentence_pairs.append(pairs[: args.per_sentence])
        for source, target in pairs[: args.per_sentence]:
            targets[source][target] += 1
            if target not in first_seen[source]:
                first_seen[source].append(target)
            chosen += 1
            missing += target not in h
    with open(args.out, "w", encoding="utf-8") as out:
        out.write(f"# oracle terms: {chosen} sentence pairs chosen, {missing} absent from the baseline output\n")
        for source in sorted(targets):
            best = max(first_seen[source], key=lambda t: targets[source][t])  # max keeps the first of ties
            out.write(f"{source}\t{best}\n")
    if args.sentence_out:
        Path(args.sentence_out).write_text("".join("\t".join(t) + "\n" for t in per_sentence), encoding="utf-8")
    if args.sentence_pairs_out:
        lines = ("\t".join(f"{source}\t{target}" for source, target in pairs) + "\n" for pairs in sentence_pairs)
        Path(args.sentence_pairs_out).write_text("".join(lines), encoding="utf-8")
    print(f"{len(targets)} terms from {chosen} chosen pairs ({missing} absent from --hyp) -> {args.out}")


if __name__ == "__main__":
    main()
