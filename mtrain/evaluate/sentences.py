"""Per-sentence scores (`mtrain eval per_sentence=true`): one TSV row per line, and the worst lines.

Each line gets sacreBLEU's own sentence scorers, set as the corpus metrics are (tokenize,
lowercase, chrf_word_order): `BLEU(effective_order=True).sentence_score`, so a short
sentence without a matching 4-gram is not 0, and `CHRF().sentence_score`; and the model's
score of its hypothesis (the length-normalised log-probability) when it was decoded here.
A sentence score says where a system fails, not how good it is: sentence-BLEU is noisy, so
the worst lines are a list to read, never a number to compare systems by.

The TSV (`<split>.sentences.tsv` beside the report, `<hyp file>.sentences.tsv` for `hyp=`)
has a header row; its text is escaped so a row stays one line of tab-separated fields:
backslash, tab, newline and carriage return become `\\\\`, `\\t`, `\\n`, `\\r`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mtrain.evaluate.metrics import build_metric
from mtrain.evaluate.tables import Table
from mtrain.rundir import atomic_write_text

SENTENCES_SUFFIX = ".sentences.tsv"
_TSV_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


@dataclass
class SentenceScore:
    line: int  # 1-based line of the split (or hypothesis file)
    bleu: float  # sentence-BLEU, effective order
    chrf: float
    model_score: float | None  # length-normalised log-probability; None: not decoded here (or a blank source)
    source: str  # "" when unknown (hyp= ref=)
    hypothesis: str
    references: list[str]  # one per reference stream
    expected_utility: float | None = None  # MBR decoding's (mtrain.decode.selection.mbr); None: not decoded with MBR


def sentences_path(out_dir: Path, name: str) -> Path:
    """`<out_dir>/<name>.sentences.tsv`; `name` is the split (run=) or the hypothesis file's name (hyp=)."""
    return Path(out_dir) / f"{name}{SENTENCES_SUFFIX}"


def score_sentences(
    hypotheses: Sequence[str],
    references: Sequence[Sequence[str]],
    sources: Sequence[str] | None = None,
    model_scores: Sequence[float | None] | None = None,
    tokenize: str = "13a",
    lowercase: bool = False,
    chrf_word_order: int = 0,
    expected_utilities: Sequence[float | None] | None = None,
) -> list[SentenceScore]:
    """Sentence-BLEU and chrF of every hypothesis against its references (`references[k][i]`)."""
    bleu = build_metric("bleu", tokenize, lowercase, chrf_word_order, effective_order=True)
    chrf = build_metric("chrf", tokenize, lowercase, chrf_word_order)
    rows = []
    for i, hypothesis in enumerate(hypotheses):
        refs = [stream[i] for stream in references]
        rows.append(
            SentenceScore(
                line=i + 1,
                bleu=float(bleu.sentence_score(hypothesis, refs).score),
                chrf=float(chrf.sentence_score(hypothesis, refs).score),
                model_score=model_scores[i] if model_scores is not None else None,
                source=sources[i] if sources is not None else "",
                hypothesis=hypothesis,
                references=refs,
                expected_utility=expected_utilities[i] if expected_utilities is not None else None,
            )
        )
    return rows


def worst_lines(rows: Sequence[SentenceScore], count: int) -> list[SentenceScore]:
    """The `count` rows of lowest sentence-BLEU, lowest first (ties: lower chrF, then line order)."""
    return sorted(rows, key=lambda row: (row.bleu, row.chrf, row.line))[:count]


def tsv_field(text: str) -> str:
    """`text` as one TSV field: no tab or line break left in it (see the module docstring)."""
    return text.translate(_TSV_ESCAPES)


def write_sentences_tsv(path: Path, rows: Sequence[SentenceScore]) -> None:
    """The TSV, atomically: header, then one row per line of the split."""
    streams = len(rows[0].references) if rows else 1
    ref_columns = ["reference"] if streams == 1 else [f"reference_{k + 1}" for k in range(streams)]
    # MBR decoding's expected utility gets a column after model_score, only when decoded with MBR.
    with_utility = any(row.expected_utility is not None for row in rows)
    header = ["line", "bleu", "chrf", "model_score", *(["expected_utility"] if with_utility else [])]
    header += ["source", "hypothesis", *ref_columns]
    lines = ["\t".join(header)]
    for row in rows:
        model_score = "" if row.model_score is None else f"{row.model_score:.4f}"
        utility = "" if row.expected_utility is None else f"{row.expected_utility:.4f}"
        fields = [
            str(row.line),
            f"{row.bleu:.4f}",
            f"{row.chrf:.4f}",
            model_score,
            *([utility] if with_utility else []),
            *(tsv_field(text) for text in (row.source, row.hypothesis, *row.references)),
        ]
        lines.append("\t".join(fields))
    atomic_write_text(path, "\n".join(lines) + "\n")


def per_sentence_record(path: Path, rows: Sequence[SentenceScore], count: int) -> dict[str, Any]:
    """What a report says of the per-sentence scores: the TSV's path and the worst lines."""
    return {"path": str(Path(path).resolve()), "worst_lines": [_record(row) for row in worst_lines(rows, count)]}


def _record(row: SentenceScore) -> dict[str, Any]:
    """A row as the report lists it; the expected utility only when decoded with MBR."""
    record = asdict(row)
    if record["expected_utility"] is None:
        del record["expected_utility"]
    return record


def worst_lines_table(worst: Sequence[dict[str, Any]]) -> Table:
    """The worst lines of a `per_sentence_record` for the terminal: line, BLEU, chrF, hypothesis."""
    table = Table(["line", "BLEU", "chrF", "hypothesis (lowest sentence-BLEU first)"])
    for row in worst:
        table.add(row["line"], row["bleu"], row["chrf"], " ".join(row["hypothesis"].split()))
    return table
