"""A tagged test set for inline markup, and the score of its translation.

    python scripts/markup_testset.py build --src test.de.gz --align test.de-en.align --out test.tagged.de
    mtrain translate run=RUN input=test.tagged.de output=out.tagged.en format=xml
    mtrain translate run=RUN input=test.de.gz output=out.plain.en
    python scripts/markup_testset.py score --src test.tagged.de --hyp out.tagged.en --plain out.plain.en --ref test.en.gz

build: each source line gets tags around source words that an aligner aligned (so each tag has
somewhere to go in a good translation): one to three elements (`<b>`, `<i>`, `<a href="...">`,
with attributes holding `&amp;` and a quoted `>`), nested one time in three, over spans of one
to three words, and a self-closing `<x id="N"/>` on every other line. Seeded: the same inputs
give the same file. Text `&`, `<`, `>` are escaped, so every line is well-formed XML.

score: the share of outputs that are well-formed XML and carry every tag of their source (as
a multiset), how many elements still enclose words (the others were written empty), BLEU/chrF of the tag-stripped outputs against the references beside the plain
decode's, and BLEU of the stripped outputs against the plain decode (how much taking the tags
out changes the translation: 100 = nothing).
"""

from __future__ import annotations

import argparse
import gzip
import random
from collections import Counter
from pathlib import Path
from xml.parsers import expat

from mtrain.decode.requests.markup import Element, MarkupError, parse_markup, tags_of

HREFS = ["https://example.org/?a=1&amp;b=2", "x>y", "#top"]


def read_lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as lines:
        return [line.rstrip("\n") for line in lines]


def escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def tag_line(words: list[str], aligned: set[int], rng: random.Random, number: int) -> str:
    """The line's words with tags around aligned words (spans do not cross)."""
    opening: dict[int, list[str]] = {}
    closing: dict[int, list[str]] = {}
    taken: set[int] = set()
    candidates = sorted(aligned)
    rng.shuffle(candidates)
    for start in candidates[: rng.randint(1, 3)]:
        if start in taken:
            continue
        end = start
        while end + 1 < len(words) and end + 1 not in taken and end - start < 2 and rng.random() < 0.5:
            end += 1
        name = rng.choice(["b", "i", "a"])
        attributes = f' href="{rng.choice(HREFS)}"' if name == "a" else ""
        opening.setdefault(start, []).append(f"<{name}{attributes}>")
        closing.setdefault(end, []).insert(0, f"</{name}>")
        if end > start and rng.random() < 1 / 3:  # a nested element on the span's first word
            opening[start].append("<i>")
            closing.setdefault(start, []).insert(0, "</i>")
        taken.update(range(start, end + 1))
    out = []
    for index, word in enumerate(words):
        out.append("".join(opening.get(index, [])) + escape(word) + "".join(closing.get(index, [])))
    if number % 2 == 0 and words:
        position = rng.randrange(len(out) + 1)
        out.insert(position, f'<x id="{number}"/>')
    return " ".join(out)


def build(args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    sources = read_lines(args.src)
    alignments = read_lines(args.align)
    lines = []
    for number, (source, links) in enumerate(zip(sources, alignments, strict=True)):
        aligned = {int(link.split("-")[0]) for link in links.split()}
        words = source.split()
        lines.append(tag_line(words, aligned or set(range(len(words))), rng, number) if words else "")
    args.out.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    print(f"{args.out}: {len(lines)} tagged lines")


def well_formed(line: str) -> bool:
    try:
        expat.ParserCreate().Parse(f"<r>{line}</r>", True)
    except expat.ExpatError:
        return False
    return True


def elements_with_words(element: Element) -> int:
    """Elements of the tree that enclose at least one word."""
    return sum(
        (child.end > child.start) + elements_with_words(child)
        for child in element.children
        if isinstance(child, Element)
    )


def score(args: argparse.Namespace) -> None:
    import sacrebleu

    sources, hyps = read_lines(args.src), read_lines(args.hyp)
    plain, refs = read_lines(args.plain), read_lines(args.ref)
    complete, stripped = 0, []
    enclosing = [0, 0]  # elements enclosing words: in the sources, in the outputs
    for source, hyp in zip(sources, hyps, strict=True):
        try:
            markup = parse_markup(hyp, "xml")
        except MarkupError:
            stripped.append(hyp)
            continue
        stripped.append(markup.text)
        source_markup = parse_markup(source, "xml")
        same_tags = Counter(tags_of(markup)) == Counter(tags_of(source_markup))
        enclosing[0] += elements_with_words(source_markup.root)
        enclosing[1] += elements_with_words(markup.root)
        complete += well_formed(hyp) and same_tags
    n = len(hyps)
    print(f"well-formed with every tag: {complete}/{n} = {100 * complete / n:.1f}%")
    print(
        f"elements enclosing words: {enclosing[1]} in the outputs, {enclosing[0]} in the sources "
        f"({100 * enclosing[1] / max(enclosing[0], 1):.1f}%; the others were written empty)"
    )
    for name, outputs in (("tag-stripped output", stripped), ("plain decode", plain)):
        bleu = sacrebleu.corpus_bleu(outputs, [refs]).score
        chrf = sacrebleu.corpus_chrf(outputs, [refs]).score
        print(f"{name}: BLEU {bleu:.2f} chrF {chrf:.2f} (against the references)")
    print(f"tag-stripped output against the plain decode: BLEU {sacrebleu.corpus_bleu(stripped, [plain]).score:.2f}")
    same = sum(s == p for s, p in zip(stripped, plain, strict=True))
    print(f"identical to the plain decode: {same}/{n} = {100 * same / n:.1f}%")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("build", help="write the tagged source")
    make.add_argument("--src", type=Path, required=True)
    make.add_argument("--align", type=Path, required=True, help="Pharaoh alignments of src and its reference")
    make.add_argument("--out", type=Path, required=True)
    make.add_argument("--seed", type=int, default=1)
    judge = commands.add_parser("score", help="score the translation of a tagged source")
    judge.add_argument("--src", type=Path, required=True, help="the tagged source")
    judge.add_argument("--hyp", type=Path, required=True, help="its translation (format=xml)")
    judge.add_argument("--plain", type=Path, required=True, help="the plain decode of the untagged source")
    judge.add_argument("--ref", type=Path, required=True)
    args = parser.parse_args(argv)
    build(args) if args.command == "build" else score(args)


if __name__ == "__main__":
    main()
