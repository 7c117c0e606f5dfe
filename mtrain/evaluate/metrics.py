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
from collections.abc import Sequence
from pathlib import Path

from sacrebleu.metrics.base import Metric
from sacrebleu.metrics.bleu import BLEU
from sacrebleu.metrics.chrf import CHRF
from sacrebleu.metrics.ter import TER

from mtrain.errors import MtrainError
from mtrain.rundir import RunDir

METRIC_NAMES = ("bleu", "chrf", "ter")
# Tokenizers that need optional packages (sacrebleu[ja], sacrebleu[ko]).
_OPTIONAL_TOKENIZERS = {"ja-mecab": "sacrebleu[ja]", "ko-mecab": "sacrebleu[ko]"}


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
    names = check_metric_names(metrics)
    check_lengths(len(hyps), [len(stream) for stream in refs])
    results: dict[str, dict[str, object]] = {}
    for name in names:
        metric = build_metric(name, tokenize, lowercase, chrf_word_order)
        score = metric.corpus_score(list(hyps), [list(stream) for stream in refs])
        signature = metric.get_signature().format()
        results[name] = {
            "name": score.name,
            "score": float(score.score),
            "signature": signature,
            "text": score.format(signature=signature),
        }
    return results


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


def read_lines(path: str | Path, what: str = "file") -> list[str]:
    """A text file's lines without trailing whitespace (as `sacrebleu` reads them); `.gz` too.

    Lines end at "\n" only, as `mtrain fit` and `mtrain translate` read them: a CRLF end is
    trimmed and a lone CR inside a line is a space, never a line break (which would shift
    every later line against the other file)."""
    path = Path(path)
    if path.is_dir():
        hint = "; to score a run, use run=DIR" if RunDir(path).checkpoint_dir.is_dir() else ""
        raise MtrainError(f"{what}={path}: a directory, not a text file{hint}")
    if not path.is_file():
        raise MtrainError(f"{what}={path}: no such file")
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rt", encoding="utf-8", newline="\n") as handle:
                return [line.replace("\r", " ").rstrip() for line in handle]
        with open(path, encoding="utf-8", newline="\n") as handle:
            return [line.replace("\r", " ").rstrip() for line in handle]
    except UnicodeDecodeError as error:
        raise MtrainError(f"{what}={path}: not valid UTF-8 ({error.reason} at byte {error.start})") from error


def score_files(
    hyp_path: str | Path,
    ref_paths: Sequence[str | Path],
    metrics: Sequence[str] = METRIC_NAMES,
    tokenize: str = "13a",
    lowercase: bool = False,
    chrf_word_order: int = 0,
) -> dict[str, dict[str, object]]:
    """Score a hypothesis file against one or more reference files."""
    check_metric_names(metrics)
    if not ref_paths:
        raise MtrainError("ref: no reference given; pass ref=FILE (or ref=[FILE1,FILE2])")
    hyps = read_lines(hyp_path, "hyp")
    refs = [read_lines(path, "ref") for path in ref_paths]
    check_lengths(len(hyps), [len(stream) for stream in refs], f"hyp={hyp_path}", [f"ref={path}" for path in ref_paths])
    return score_corpus(hyps, refs, metrics, tokenize, lowercase, chrf_word_order)
