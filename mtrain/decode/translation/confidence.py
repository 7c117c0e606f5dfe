"""A translation's confidence: a number in [0, 1] estimating its sentence chrF / 100.

The signal is the best hypothesis's mean token log-probability, log p(y | x) / (len(y) + 1)
(EOS counted; whatever the decode's length penalty). Of the cheap signals measured
(scripts/measure_confidence.py; docs/TRANSLATE.md, "Confidence scores") it is the one every
run and engine has at no cost: Pearson 0.60-0.65 with sentence chrF on Multi30k's test set,
where the n-best's agreement gave 0.18-0.21 and a reverse model's score 0.65-0.71 (with it,
0.70-0.73), for a second run and a fifth more decoding time.

A run's calibration maps the signal to an estimate of sentence chrF / 100: a monotone
(isotonic) fit on its validation set, `confidence.json` in the run directory, which `mtrain
fit` writes after its last validation. Without one (older runs, imported models) the score is
the uncalibrated exp of the signal, the geometric mean of the tokens' probabilities, and
`Confidence.source` says which of the two a score is.

Self-contained on purpose (numpy, the standard library and the shared core): any decode layer
may import it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Protocol

import numpy as np

from mtrain.errors import MtrainError
from mtrain.rundir import CONFIDENCE_FILE, atomic_write_text

SIGNAL = "mean_log_prob"  # the only signal a calibration maps today
DEFAULT_BINS = 20  # equal-count bins of the validation set before the isotonic fit
UNCALIBRATED = "uncalibrated: exp of the mean token log-probability"


class ScoredHypothesis(Protocol):
    """What a score is made from: mtrain.decode.search.hypothesis.Hypothesis has both."""

    log_prob: float  # EOS included
    tokens: list[int]  # without bos/eos


def mean_log_prob(log_prob: float, output_tokens: int) -> float:
    """The signal: a hypothesis's log-probability per output token, EOS included (`Hypothesis.log_prob`
    and `len(Hypothesis.tokens)`), so it does not depend on the decode's length penalty."""
    return float(log_prob) / (output_tokens + 1)


@dataclass(frozen=True)
class Calibration:
    """A non-decreasing piecewise-linear map from the signal to [0, 1]: `values[i]` at
    `knots[i]` (strictly increasing), linear between them, flat beyond the ends."""

    knots: tuple[float, ...]
    values: tuple[float, ...]
    signal: str = SIGNAL
    fitted_on: str = ""  # what it was fitted on, for the reader: "data.splits.valid=val, 1,014 sentences, beam 1"

    def __post_init__(self) -> None:
        if not self.knots or len(self.knots) != len(self.values):
            raise MtrainError(f"confidence calibration: {len(self.knots)} knots for {len(self.values)} values")
        if any(b <= a for a, b in pairwise(self.knots)):
            raise MtrainError("confidence calibration: the knots must increase strictly")
        if any(b < a for a, b in pairwise(self.values)):
            raise MtrainError("confidence calibration: the values must not decrease (a monotone map)")
        if any(not 0.0 <= v <= 1.0 for v in self.values):
            raise MtrainError("confidence calibration: every value must lie in [0, 1]")

    def __call__(self, signal: float) -> float:
        """The estimate of sentence chrF / 100 for `signal` (nan or -inf: the lowest value)."""
        if math.isnan(signal):
            return self.values[0]
        return float(np.interp(signal, self.knots, self.values))

    def to_json(self) -> dict[str, object]:
        return {
            "signal": self.signal,
            "estimates": "sentence chrF / 100",
            "fitted_on": self.fitted_on,
            "knots": [round(k, 6) for k in self.knots],
            "values": [round(v, 6) for v in self.values],
        }

    @classmethod
    def from_json(cls, record: dict[str, object], where: str = CONFIDENCE_FILE) -> Calibration:
        try:
            signal = str(record["signal"])
            knots = tuple(float(k) for k in record["knots"])  # type: ignore[attr-defined]
            values = tuple(float(v) for v in record["values"])  # type: ignore[attr-defined]
        except (KeyError, TypeError, ValueError) as error:
            raise MtrainError(f"{where}: not a confidence calibration ({error!r}); refit it") from None
        if signal != SIGNAL:
            raise MtrainError(f"{where}: signal {signal!r} is not one this version computes ({SIGNAL}); refit it")
        try:
            return cls(knots, values, signal, str(record.get("fitted_on", "")))
        except MtrainError as error:
            raise MtrainError(f"{where}: {error}; refit it") from None


def pool_adjacent_violators(targets: Sequence[float], weights: Sequence[float]) -> list[float]:
    """The non-decreasing sequence nearest `targets` in weighted least squares (isotonic
    regression): adjacent blocks that decrease are pooled into their weighted mean."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for target, weight in zip(targets, weights, strict=True):
        blocks.append([float(target), float(weight), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            mean, weight_sum, count = blocks.pop()
            previous = blocks[-1]
            total = previous[1] + weight_sum
            previous[0] = (previous[0] * previous[1] + mean * weight_sum) / total
            previous[1], previous[2] = total, previous[2] + count
    return [mean for mean, _, count in blocks for _ in range(int(count))]


def fit_calibration(
    signals: Sequence[float], targets: Sequence[float], bins: int = DEFAULT_BINS, fitted_on: str = ""
) -> Calibration:
    """An isotonic map from `signals` to `targets` (sentence chrF / 100, in [0, 1]).

    The pairs are sorted by signal and cut into `bins` bins of equal count (as equal as the
    count allows; pairs of the same signal kept together), each bin a knot at its mean signal
    with its mean target; pool-adjacent-violators makes the knots' values non-decreasing. So a
    calibration is `bins` pairs of numbers at most, and no single sentence moves it."""
    x = np.asarray(signals, dtype=np.float64)
    y = np.asarray(targets, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise MtrainError(f"confidence calibration: {x.size} signals for {y.size} targets")
    finite = np.isfinite(x) & np.isfinite(y)
    x, y = x[finite], np.clip(y[finite], 0.0, 1.0)
    if x.size < 2 or bins < 1:
        raise MtrainError(f"confidence calibration: {x.size} scored sentences; at least 2 are needed")
    order = np.argsort(x, kind="stable")
    x, y = x[order], y[order]
    bounds = np.linspace(0, x.size, min(bins, x.size) + 1).round().astype(int)
    knots: list[float] = []
    means: list[float] = []
    weights: list[float] = []
    start = 0
    for end in bounds[1:]:
        end = int(end)
        while end < x.size and end > start and x[end] == x[end - 1]:  # a signal's pairs stay in one bin
            end += 1
        if end <= start:
            continue
        knots.append(float(x[start:end].mean()))
        means.append(float(y[start:end].mean()))
        weights.append(float(end - start))
        start = end
    values = pool_adjacent_violators(means, weights)
    if len(knots) == 1:  # one signal throughout: a flat map
        knots, values = [knots[0] - 1.0, knots[0] + 1.0], [values[0], values[0]]
    return Calibration(tuple(knots), tuple(min(max(v, 0.0), 1.0) for v in values), SIGNAL, fitted_on)


def write_calibration(path: str | Path, calibration: Calibration) -> None:
    """Write `calibration` as JSON (atomically: a reader never sees half a file)."""
    atomic_write_text(path, json.dumps(calibration.to_json(), indent=2) + "\n")


def read_calibration(path: str | Path) -> Calibration:
    path = Path(path)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise MtrainError(f"{path}: cannot read the confidence calibration ({error}); refit it") from None
    if not isinstance(record, dict):
        raise MtrainError(f"{path}: not a confidence calibration (a JSON object expected); refit it")
    return Calibration.from_json(record, str(path))


@dataclass(frozen=True)
class Confidence:
    """What turns a hypothesis into its confidence score: a run's calibration, or none."""

    calibration: Calibration | None = None

    @property
    def source(self) -> str:
        """How the scores are made, for a start line or a response's metadata."""
        if self.calibration is None:
            return UNCALIBRATED
        fitted = f" on {self.calibration.fitted_on}" if self.calibration.fitted_on else ""
        return f"calibrated{fitted}: estimated sentence chrF / 100 from the mean token log-probability"

    @property
    def calibrated(self) -> bool:
        return self.calibration is not None

    def of(self, hypothesis: ScoredHypothesis) -> float:
        """The confidence in [0, 1] of a decoded hypothesis (the best of its sentence)."""
        return self.score(hypothesis.log_prob, len(hypothesis.tokens))

    def score(self, log_prob: float, output_tokens: int) -> float:
        """The confidence in [0, 1] of a hypothesis with `log_prob` (EOS included) over
        `output_tokens` tokens (EOS excluded): `Hypothesis.log_prob`, `len(Hypothesis.tokens)`."""
        signal = mean_log_prob(log_prob, output_tokens)
        if self.calibration is not None:
            return self.calibration(signal)
        return 0.0 if math.isnan(signal) else min(max(math.exp(signal), 0.0), 1.0)


def run_confidence(run_dir: str | Path) -> Confidence:
    """The confidence of a run's translations: its `confidence.json` if it has one, else uncalibrated."""
    path = Path(run_dir) / CONFIDENCE_FILE
    return Confidence(read_calibration(path) if path.is_file() else None)
