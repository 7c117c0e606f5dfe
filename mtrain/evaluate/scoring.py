"""The one evaluation path: translate a split's sources, score them against its references.

`mtrain fit` (validation BLEU during training, the test split at the end) and `mtrain eval`
all call `translate_and_score`; only what they do with the result differs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Sequence

from mtrain.errors import MtrainError
from mtrain.evaluate.metrics import check_lengths, score_corpus

# Sources in, one hypothesis per source out (any engine: torch, CTranslate2, ...).
Translate = Callable[[List[str]], List[str]]


@dataclass
class Scored:
    hypotheses: List[str]
    scores: Dict[str, Dict[str, Any]]  # per metric: name, score, signature, text (`score_corpus`)
    seconds: float  # translation time

    @property
    def sentences_per_second(self) -> float:
        return len(self.hypotheses) / max(self.seconds, 1e-9)


def check_references(references: Sequence[Sequence[str]], name: str) -> None:
    """Refuse reference streams that are empty or blank throughout: every score would be 0."""
    for stream in references:
        if not any(line.strip() for line in stream):
            raise MtrainError(
                f"{name}: the references are {'empty' if not stream else 'blank on every line'}; "
                "a score against them means nothing. Check the split's files (or ref=)"
            )


def translate_and_score(translate: Translate, sources: Sequence[str], references: Sequence[Sequence[str]],
                        name: str, metrics: Sequence[str] = ("bleu",), tokenize: str = "13a",
                        lowercase: bool = False, chrf_word_order: int = 0) -> Scored:
    """Translate `sources` and score the hypotheses with sacreBLEU against each reference stream.

    `name` says what is scored in error messages (e.g. "data.splits.test=test_2016_flickr").
    """
    check_references(references, name)
    check_lengths(len(sources), [len(stream) for stream in references], f"{name} sources")
    start = time.perf_counter()
    hypotheses = list(translate(list(sources)))
    seconds = time.perf_counter() - start
    scores = score_corpus(hypotheses, references, metrics, tokenize, lowercase, chrf_word_order)
    return Scored(hypotheses, scores, seconds)
