"""A split translated and scored: what the one evaluation path (mtrain.evaluate.scoring)
returns and a report (mtrain.evaluate.report) is written from; below both."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Scored:
    """A split's hypotheses, their corpus scores and what decoding them took."""

    hypotheses: list[str]
    scores: dict[str, dict[str, Any]]  # per metric: name, score, signature, text (`score_corpus`)
    seconds: float  # translation time
    # Per line, the model's score of its hypothesis (None for a blank source, never decoded);
    # None when the translator gave plain text.
    model_scores: list[float | None] | None = None
    # Per line, MBR decoding's expected utility of its hypothesis; None when not decoded with MBR.
    expected_utilities: list[float | None] | None = None

    @property
    def sentences_per_second(self) -> float:
        return len(self.hypotheses) / max(self.seconds, 1e-9)
