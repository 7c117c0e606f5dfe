"""A run's confidence calibration from decoded sentences: their signal against their sentence chrF.

`mtrain fit` calls `calibrate` on its last validation's decodes and writes the result as the
run's `confidence.json` (mtrain.decode.translation.confidence, which applies it); scripts/
measure_confidence.py fits one for an existing run. The target is sacreBLEU's sentence chrF
(default chrF2, character 6-grams), divided by 100.
"""

from __future__ import annotations

from collections.abc import Sequence

from mtrain.decode.translation.confidence import Calibration, fit_calibration
from mtrain.evaluate.metrics import build_metric


def sentence_chrf(hypotheses: Sequence[str], references: Sequence[str]) -> list[float]:
    """sacreBLEU's sentence chrF (0-100) of each hypothesis against its one reference."""
    chrf = build_metric("chrf")
    return [float(chrf.sentence_score(h, [r]).score) for h, r in zip(hypotheses, references, strict=True)]


def calibrate(
    signals: Sequence[float | None], hypotheses: Sequence[str], references: Sequence[str], fitted_on: str
) -> Calibration:
    """The calibration of `signals` (None: a blank source, never decoded, left out) against
    the sentence chrF / 100 of `hypotheses`."""
    kept = [(s, h, r) for s, h, r in zip(signals, hypotheses, references, strict=True) if s is not None]
    chrf = sentence_chrf([h for _, h, _ in kept], [r for _, _, r in kept])
    return fit_calibration([s for s, _, _ in kept], [c / 100.0 for c in chrf], fitted_on=fitted_on)
