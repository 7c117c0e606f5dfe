"""Decode a run's test split without terms, with the glossary as hard constraints alone, with
term placement, and (a term-aware model) with the terms written into its source, and tabulate the terminology metrics beside BLEU, chrF and the decoding speed
(each row one `mtrain eval run=... terms=...`, its report in --out).

    python scripts/bench_terms.py --run runs/m30k --terms synonyms.tsv --ref test.synonyms.en \
        --out bench/synonyms [--src test.de] [-- decode.beam=5 checkpoint=last]

--ref: the references scored against (a synonym glossary's references hold its terms:
scripts/synonym_terms.py; an oracle glossary's are the split's own: leave --ref out). The
rows decode one after another in one process each, so their speeds compare on a quiet machine
only as ratios measured side by side.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mtrain.decode.requests.terminology import read_glossary
from mtrain.evaluate.metrics import read_lines
from mtrain.evaluate.terminology import GlossaryFile, occurrences, term_instances, words

KEEP = "decode.term_avoid_replaced=false"  # the glossary's third field not used at decoding
AVOID = "decode.term_avoid_replaced=true"  # (the default)
MODES = {
    "no terms": [],
    "constraints": ["decode.term_mode=constraints", "decode.term_placement=none", KEEP],
    "constraints + placement": ["decode.term_mode=constraints", "decode.term_placement=aligned", KEEP],
    # the words each term replaces (the glossary's third field) avoided where the term applies
    "constraints + placement + avoid": ["decode.term_mode=constraints", "decode.term_placement=aligned", AVOID],
    # a term-aware model (model.term_factors, trained with train.term_alignment): the terms in its source
    "annotation": ["decode.term_mode=annotation", KEEP],
    "annotation + avoid": ["decode.term_mode=annotation", AVOID],
    "annotation + constraints": ["decode.term_mode=both", "decode.term_placement=none", KEEP],
    "annotation + constraints + placement": ["decode.term_mode=both", "decode.term_placement=aligned", KEEP],
    "annotation + constraints + placement + avoid": ["decode.term_mode=both", "decode.term_placement=aligned", AVOID],
}


def mtrain(*args: str) -> None:
    result = subprocess.run([sys.executable, "-m", "mtrain", *args], capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"mtrain {' '.join(args)} failed:\n{result.stderr[-2000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True)
    parser.add_argument("--terms", required=True, help="the glossary (source<TAB>term[<TAB>replaced words])")
    parser.add_argument("--ref", help="references to score against (default: the split's)")
    parser.add_argument("--out", required=True, help="a directory for the reports")
    parser.add_argument(
        "--modes",
        default="no terms,constraints,constraints + placement",
        help=f"which rows, comma-separated, of: {', '.join(MODES)} (the annotation rows need a term-aware run)",
    )
    parser.add_argument("overrides", nargs="*", help="more `mtrain eval` overrides (after --)")
    args = parser.parse_args()

    out = Path(args.out)
    ref = [f"ref={args.ref}"] if args.ref else []
    rows = []
    for name in args.modes.split(","):
        directory = out / name.replace(" + ", "_").replace(" ", "_")
        common = [f"run={args.run}", "split=test", f"out={directory}", *ref, *args.overrides]
        if name == "no terms":
            mtrain("eval", *common)
            report = json.loads((directory / "test.json").read_text(encoding="utf-8"))
            # the term metrics of the output decoded without terms, as `eval hyp=... terms=...` scores it
            files = {record["role"]: record["path"] for record in report["data"]}
            report["terms"] = GlossaryFile(args.terms, read_glossary(args.terms)).record(
                read_lines(files["source"]), read_lines(files["hypotheses"]), read_lines(args.ref or files["reference"])
            )
        else:
            mtrain("eval", *common, f"terms={args.terms}", *MODES[name])
            report = json.loads((directory / "test.json").read_text(encoding="utf-8"))
        files = {record["role"]: record["path"] for record in report["data"]}
        report["after_the_end"] = after_the_end(
            read_glossary(args.terms), read_lines(files["source"]), read_lines(files["hypotheses"])
        )
        rows.append((name, report))
    print(table(rows))


def after_the_end(glossary, sources: list[str], hypotheses: list[str]) -> int:
    """Outputs holding one of their sentence's terms after their last sentence-final mark."""
    count = 0
    for source, hypothesis in zip(sources, hypotheses, strict=True):
        tokens = words(hypothesis)
        ends = [i for i, token in enumerate(tokens) if token in (".", "!", "?")]
        if not ends:
            continue
        starts = [s for _, term in term_instances(glossary, source) for s in occurrences(words(term), tokens)]
        count += any(start > ends[-1] for start in starts)
    return count


def table(rows: list[tuple[str, dict]]) -> str:
    def percent(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:.1f}"

    lines = [
        "| decoding | term acc. | usual kept beside | window 2 | window 3 | 1-TERm | BLEU | chrF | term after the end | sent/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, report in rows:
        terms, metrics = report["terms"], report["metrics"]
        lines.append(
            f"| {name} | {percent(terms['exact_match_accuracy'])} | {percent(terms['usual_kept_beside'])} | "
            f"{percent(terms['window_overlap_2'])} | {percent(terms['window_overlap_3'])} | "
            f"{percent(terms['one_minus_term'])} | {metrics['bleu']['score']:.2f} | {metrics['chrf']['score']:.2f} | "
            f"{report['after_the_end']} | {report['sentences_per_s']:.2f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
