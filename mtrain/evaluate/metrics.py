"""Corpus metrics through sacreBLEU's Python API: BLEU, chrF/chrF++ and TER with signatures.

Scores are computed on detokenized text, exactly as the `sacrebleu` command line computes
them, so a number mtrain reports can be reproduced by anyone with the hypothesis file and
the signature printed next to it.

References follow sacreBLEU's layout: `refs[k][i]` is the k-th reference of sentence i,
i.e. one list per reference file ("stream").
"""

from __future__ import annotations

import gzip
import importlib.util
import zlib
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice, zip_longest
from pathlib import Path

from sacrebleu.metrics.base import Metric
from sacrebleu.metrics.bleu import BLEU
from sacrebleu.metrics.chrf import CHRF
from sacrebleu.metrics.ter import TER

from mtrain.config import DEFAULT_MAX_LINE_CHARS
from mtrain.data.bounded_lines import bounded_lines
from mtrain.errors import MtrainError
from mtrain.rundir import RunDir

METRIC_NAMES = ("bleu", "chrf", "ter")
# Tokenizers that need optional packages (sacrebleu[ja], sacrebleu[ko]).
_OPTIONAL_TOKENIZERS = {"ja-mecab": "sacrebleu[ja]", "ko-mecab": "sacrebleu[ko]"}
STREAM_CHUNK = 10_000  # lines whose statistics are computed together (a few MB)


def check_metric_names(metrics: Sequence[str]) -> list[str]:
    """Lower-cased metric names; an unknown one is an error that lists the known ones."""
    names = [str(name).lower() for name in metrics]
    unknown = [name for name in names if name not in METRIC_NAMES]
    if unknown:
        raise MtrainError(
            f"metrics: unknown metric {', '.join(repr(n) for n in unknown)}; choose from {', '.join(METRIC_NAMES)}"
        )
    if not names:
        raise MtrainError(f"metrics: empty list; choose from {', '.join(METRIC_NAMES)}")
    return names


def build_metric(
    name: str,
    tokenize: str = "13a",
    lowercase: bool = False,
    chrf_word_order: int = 0,
    references: Sequence[Sequence[str]] | None = None,
    effective_order: bool = False,
) -> Metric:
    """One sacreBLEU metric object with mtrain's options.

    `tokenize` is BLEU's tokenizer; `lowercase` applies to BLEU and chrF. TER keeps
    TERCOM's defaults (case-insensitive), as `sacrebleu -m ter` does. Passing
    `references` caches their statistics (as the sacreBLEU command line does).
    `effective_order` is BLEU's for sentence scores (n-gram orders without a match are left out).
    """
    (name,) = check_metric_names([name])
    if name == "bleu":
        _check_tokenizer(tokenize)
        try:
            return BLEU(tokenize=tokenize, lowercase=lowercase, references=references, effective_order=effective_order)
        except (ImportError, RuntimeError) as error:  # MeCab missing at first use
            raise MtrainError(_missing_tokenizer_message(tokenize)) from error
    if name == "chrf":
        if chrf_word_order not in (0, 1, 2):
            raise MtrainError(f"chrf_word_order={chrf_word_order}: use 0 (chrF) or 2 (chrF++)")
        return CHRF(word_order=chrf_word_order, lowercase=lowercase, references=references)
    return TER(references=references)


def _check_tokenizer(tokenize: str) -> None:
    if tokenize not in BLEU.TOKENIZERS:
        raise MtrainError(
            f"tokenize={tokenize!r}: not a sacreBLEU tokenizer; choose from {', '.join(sorted(BLEU.TOKENIZERS))}"
        )
    if tokenize in _OPTIONAL_TOKENIZERS and importlib.util.find_spec("MeCab") is None:
        raise MtrainError(_missing_tokenizer_message(tokenize))  # both mecab tokenizers need it


def _missing_tokenizer_message(tokenize: str) -> str:
    extra = _OPTIONAL_TOKENIZERS.get(tokenize, "sacrebleu")
    return (
        f"tokenize={tokenize}: the tokenizer's dependencies are not installed; "
        f"run `pip install '{extra}'` or choose tokenize=13a|intl|zh"
    )


def score_corpus(
    hyps: Sequence[str],
    refs: Sequence[Sequence[str]],
    metrics: Sequence[str] = METRIC_NAMES,
    tokenize: str = "13a",
    lowercase: bool = False,
    chrf_word_order: int = 0,
) -> dict[str, dict[str, object]]:
    """Corpus scores with their signatures.

    Returns `{"bleu": {"name": "BLEU", "score": 34.2, "signature": "nrefs:1|case:mixed|...",
    "text": "BLEU|nrefs:1|... = 34.2 65.1/40.3/... (BP = ...)"}, "chrf": {...}, ...}`.
    """
    check_metric_names(metrics)
    check_lengths(len(hyps), [len(stream) for stream in refs])
    scores, _ = score_stream(
        zip(hyps, zip(*refs, strict=True), strict=True), metrics, tokenize, lowercase, chrf_word_order
    )
    return scores


def score_stream(
    lines: Iterable[tuple[str, Sequence[str]]],
    metrics: Sequence[str] = METRIC_NAMES,
    tokenize: str = "13a",
    lowercase: bool = False,
    chrf_word_order: int = 0,
    hyp_name: str = "hypotheses",
) -> tuple[dict[str, dict[str, object]], int]:
    """`score_corpus` of (hypothesis, its references) pairs read as they come, and how many
    there were: the statistics of STREAM_CHUNK lines at a time are summed, so memory stays
    bounded however long the files are (the sum is what sacreBLEU scores a corpus by)."""
    names = check_metric_names(metrics)
    scorers = [build_metric(name, tokenize, lowercase, chrf_word_order) for name in names]
    totals: list[list[float]] = [[] for _ in scorers]  # per metric: its statistics summed so far
    count = 0
    iterator = iter(lines)
    while chunk := list(islice(iterator, STREAM_CHUNK)):
        count += len(chunk)
        hyps = [hyp for hyp, _ in chunk]
        refs = [list(stream) for stream in zip(*(refs for _, refs in chunk), strict=True)]  # refs[k][i]
        for metric, total in zip(scorers, totals, strict=True):
            # sacreBLEU's own corpus_score, split in two: per-sentence statistics, then their sum scored.
            sentences = metric._extract_corpus_statistics(hyps, refs)
            summed = [sum(column) for column in zip(*sentences, strict=True)]
            total[:] = summed if not total else [a + b for a, b in zip(total, summed, strict=True)]
    if count == 0:
        raise MtrainError(f"{hyp_name}: no hypotheses (empty file); nothing to score")
    results: dict[str, dict[str, object]] = {}
    for name, metric, total in zip(names, scorers, totals, strict=True):
        score = metric._compute_score_from_stats(total)
        signature = metric.get_signature().format()
        results[name] = {
            "name": score.name,
            "score": float(score.score),
            "signature": signature,
            "text": score.format(signature=signature),
        }
    return results, count


def check_lengths(
    num_hyps: int, num_refs: Sequence[int], hyp_name: str = "hypotheses", ref_names: Sequence[str] | None = None
) -> None:
    """Hypotheses and every reference stream must have one line per sentence."""
    if not num_refs:
        raise MtrainError("ref: no reference given; pass ref=FILE (or ref=[FILE1,FILE2])")
    if num_hyps == 0:
        raise MtrainError(f"{hyp_name}: no hypotheses (empty file); nothing to score")
    ref_names = list(ref_names) if ref_names else [f"reference {k + 1}" for k in range(len(num_refs))]
    for name, count in zip(ref_names, num_refs, strict=True):
        if count != num_hyps:
            raise MtrainError(
                f"{hyp_name} has {num_hyps} lines but {name} has {count}; "
                "hypotheses and references must be line-aligned (one sentence per line)"
            )


def read_lines(path: str | Path, what: str = "file", max_chars: int = DEFAULT_MAX_LINE_CHARS) -> list[str]:
    """A text file's lines as `text_lines` reads them, in a list."""
    return list(text_lines(path, what, max_chars))


def text_lines(path: str | Path, what: str = "file", max_chars: int = DEFAULT_MAX_LINE_CHARS) -> Iterator[str]:
    """A text file's lines without trailing whitespace (as `sacrebleu` reads them); `.gz` too;
    read one at a time, a line longer than `max_chars` refused naming `what=path:line`
    (`mtrain.data.bounded_lines`).

    Lines end at "\n" only, as `mtrain fit` and `mtrain translate` read them: a CRLF end is
    trimmed and a lone CR inside a line is a space, never a line break (which would shift
    every later line against the other file)."""
    path = Path(path)
    if path.is_dir():
        hint = "; to score a run, use run=DIR" if RunDir(path).checkpoint_dir.is_dir() else ""
        raise MtrainError(f"{what}={path}: a directory, not a text file{hint}")
    if not path.is_file():
        raise MtrainError(f"{what}={path}: no such file")
    read = 0  # lines
    try:
        with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as handle:
            for raw in bounded_lines(handle, f"{what}={path}", max_chars):
                read += 1
                yield raw.decode("utf-8").replace("\r", " ").rstrip()
    except UnicodeDecodeError as error:
        raise MtrainError(
            f"{what}={path}:{read}: not valid UTF-8 ({error.reason} at byte {error.start} of the line)"
        ) from error
    except (OSError, EOFError, zlib.error) as error:
        raise MtrainError(f"{what}={path}: unreadable after line {read} ({error})") from error


def aligned_lines(
    files: Sequence[tuple[str, str | Path]], max_chars: int = DEFAULT_MAX_LINE_CHARS
) -> Iterator[list[str]]:
    """Line i of every file of `files` ((key, path) pairs: hyp=, ref=, ...) together, the files
    read side by side a line at a time; MtrainError as soon as one file ends before another, so
    a 20-line hypothesis file is refused at line 21 of a 10-million-line reference."""
    names = [f"{key}={path}" for key, path in files]
    for count, row in enumerate(zip_longest(*(text_lines(path, key, max_chars) for key, path in files))):
        if None in row:
            ended = next(name for name, line in zip(names, row, strict=True) if line is None)
            going_on = next(name for name, line in zip(names, row, strict=True) if line is not None)
            if count == 0:
                raise MtrainError(f"{ended}: no lines (empty file) beside {going_on}; nothing to score")
            raise MtrainError(
                f"{ended} has {count} lines but {going_on} has more; the files must be line-aligned "
                "(one sentence per line)"
            )
        yield list(row)


def score_files(
    hyp_path: str | Path,
    ref_paths: Sequence[str | Path],
    metrics: Sequence[str] = METRIC_NAMES,
    tokenize: str = "13a",
    lowercase: bool = False,
    chrf_word_order: int = 0,
    max_chars: int = DEFAULT_MAX_LINE_CHARS,
) -> dict[str, dict[str, object]]:
    """Score a hypothesis file against one or more reference files, read together line by line."""
    check_metric_names(metrics)
    if not ref_paths:
        raise MtrainError("ref: no reference given; pass ref=FILE (or ref=[FILE1,FILE2])")
    rows = aligned_lines([("hyp", hyp_path)] + [("ref", path) for path in ref_paths], max_chars)
    lines = ((row[0], row[1:]) for row in rows)
    return score_stream(lines, metrics, tokenize, lowercase, chrf_word_order, f"hyp={hyp_path}")[0]
