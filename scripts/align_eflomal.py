"""Word alignments of parallel text with eflomal (pip install eflomal), symmetrised, in Pharaoh format.

    python scripts/align_eflomal.py --src train.de.gz test.de.gz --tgt train.en.gz test.en.gz \\
        --out train.de-en.align test.de-en.align

Every pair of files is aligned in one eflomal run (an aligner learns from all the text it
sees: align the training corpus and a test set together), then split again into one output
per input pair, line for line. Words are the whitespace-separated tokens of each line, as in
mtrain's alignments (`decode.alignment`, `train.guided_alignment`); eflomal lowercases them
itself. eflomal aligns in both directions; the two are symmetrised with grow-diag-final-and
(Koehn et al. 2005, as Moses' and fast_align's atools compute it), or with --symmetrization
intersection|union|grow-diag-final. The output is `mtrain fit train.guided_alignment=FILE`'s
input (for the training corpus) and the reference of scripts/alignment_aer.py (for a test set).
"""

from __future__ import annotations

import argparse
import gzip
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

Links = set[tuple[int, int]]
NEIGHBOURS = ((-1, 0), (0, -1), (1, 0), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1))


def read_lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as lines:
        return [line.rstrip("\n") for line in lines]


def parse(line: str) -> Links:
    return {(int(i), int(j)) for i, _, j in (token.partition("-") for token in line.split())}


def grow_diag_final(forward: Links, backward: Links, final_and: bool = True) -> Links:
    """Koehn's grow-diag-final(-and): start from the intersection, add neighbouring links of
    the union that align a word not yet aligned, then (final) the union links of words still
    unaligned: either word (grow-diag-final) or both (-and)."""
    union = forward | backward
    links = forward & backward
    aligned_src = {i for i, _ in links}
    aligned_tgt = {j for _, j in links}
    grown = True
    while grown:
        grown = False
        for i, j in sorted(links):
            for di, dj in NEIGHBOURS:
                candidate = (i + di, j + dj)
                new_word = candidate[0] not in aligned_src or candidate[1] not in aligned_tgt
                if candidate in union and candidate not in links and new_word:
                    links.add(candidate)
                    aligned_src.add(candidate[0])
                    aligned_tgt.add(candidate[1])
                    grown = True
    for direction in (forward, backward):
        for i, j in sorted(direction):
            src_free, tgt_free = i not in aligned_src, j not in aligned_tgt
            if (src_free and tgt_free) if final_and else (src_free or tgt_free):
                links.add((i, j))
                aligned_src.add(i)
                aligned_tgt.add(j)
    return links


def symmetrise(forward: Links, backward: Links, method: str) -> Links:
    if method == "intersection":
        return forward & backward
    if method == "union":
        return forward | backward
    return grow_diag_final(forward, backward, final_and=method == "grow-diag-final-and")


def align(src_lines: list[str], tgt_lines: list[str], method: str) -> list[Links]:
    """Symmetrised links per line pair. An empty side gets no links (eflomal needs a token on each)."""
    from eflomal import Aligner

    placeholder = [not s.split() or not t.split() for s, t in zip(src_lines, tgt_lines, strict=True)]
    src = [line if not empty else "_" for line, empty in zip(src_lines, placeholder, strict=True)]
    tgt = [line if not empty else "_" for line, empty in zip(tgt_lines, placeholder, strict=True)]
    with tempfile.TemporaryDirectory() as scratch:
        fwd, rev = Path(scratch) / "fwd", Path(scratch) / "rev"
        Aligner().align(src, tgt, links_filename_fwd=str(fwd), links_filename_rev=str(rev), quiet=True)
        forward = [parse(line) for line in read_lines(fwd)]
        backward = [parse(line) for line in read_lines(rev)]
    return [
        set() if empty else symmetrise(f, b, method) for f, b, empty in zip(forward, backward, placeholder, strict=True)
    ]


def write(path: Path, links: Iterable[Links]) -> None:
    with open(path, "w", encoding="utf-8") as out:
        for line in links:
            out.write(" ".join(f"{i}-{j}" for i, j in sorted(line)) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--src", nargs="+", type=Path, required=True, help="source files (.gz read as gzip)")
    parser.add_argument("--tgt", nargs="+", type=Path, required=True, help="target files, one per --src")
    parser.add_argument("--out", nargs="+", type=Path, required=True, help="Pharaoh outputs, one per --src")
    parser.add_argument(
        "--symmetrization",
        default="grow-diag-final-and",
        choices=["grow-diag-final-and", "grow-diag-final", "intersection", "union"],
    )
    args = parser.parse_args(argv)
    if not len(args.src) == len(args.tgt) == len(args.out):
        sys.exit("align_eflomal.py: give as many --tgt and --out as --src")
    src_lines, tgt_lines, sizes = [], [], []
    for src_path, tgt_path in zip(args.src, args.tgt, strict=True):
        src, tgt = read_lines(src_path), read_lines(tgt_path)
        if len(src) != len(tgt):
            sys.exit(f"align_eflomal.py: {src_path} has {len(src)} lines, {tgt_path} {len(tgt)}")
        src_lines += src
        tgt_lines += tgt
        sizes.append(len(src))
    links = align(src_lines, tgt_lines, args.symmetrization)
    start = 0
    for path, size in zip(args.out, sizes, strict=True):
        write(path, links[start : start + size])
        start += size
        print(f"{path}: {size} lines ({args.symmetrization})", file=sys.stderr)


if __name__ == "__main__":
    main()
