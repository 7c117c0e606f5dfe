"""Spread over seeds: mean, standard deviation, Student-t confidence interval, Welch's t-test.

A handful of seeds per arm is a small sample: the interval around their mean uses Student's
t quantile, not the normal's 1.96 (with 2 seeds the 95% quantile is 12.7). Two arms' seed
means are compared with Welch's t-test, which does not assume equal variances.

The t distribution is computed here (its CDF through the regularised incomplete beta function,
its quantile by bisection) so that reports need no scipy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Spread:
    """Scores of one arm over its seeds."""

    count: int
    mean: float
    std: float | None  # sample standard deviation (n - 1); None for one seed
    ci: float | None  # half-width of the t confidence interval around the mean; None for one seed
    low: float  # the lowest and highest seed's score
    high: float


@dataclass(frozen=True)
class WelchTest:
    difference: float  # mean of the system minus mean of the baseline
    t: float
    df: float
    p_value: float  # two-sided


def spread(values: Sequence[float], confidence: float = 0.95) -> Spread:
    """Mean, standard deviation and t confidence interval of seed scores."""
    if not values:
        raise ValueError("spread of no values")
    count = len(values)
    mean = sum(values) / count
    if count < 2:
        return Spread(count, mean, None, None, mean, mean)
    std = math.sqrt(sum((value - mean) ** 2 for value in values) / (count - 1))
    ci = t_quantile(0.5 + confidence / 2, count - 1) * std / math.sqrt(count)
    return Spread(count, mean, std, ci, min(values), max(values))


def welch_test(system: Sequence[float], baseline: Sequence[float]) -> WelchTest | None:
    """Welch's two-sided t-test of two arms' seed scores; None unless each has two seeds."""
    if len(system) < 2 or len(baseline) < 2:
        return None
    a, b = spread(system), spread(baseline)
    assert a.std is not None and b.std is not None  # (two seeds each)
    var_a, var_b = a.std**2 / a.count, b.std**2 / b.count
    difference = a.mean - b.mean
    if var_a + var_b == 0:  # every seed scored alike in both arms: any difference is exact
        return WelchTest(
            difference, math.copysign(math.inf, difference) if difference else 0.0, math.inf, 0.0 if difference else 1.0
        )
    t = difference / math.sqrt(var_a + var_b)
    df = (var_a + var_b) ** 2 / (var_a**2 / (a.count - 1) + var_b**2 / (b.count - 1))
    return WelchTest(difference, t, df, 2 * (1 - t_cdf(abs(t), df)))


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom (df may be fractional: Welch)."""
    if df <= 0:
        raise ValueError(f"degrees of freedom {df}: must be positive")
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    if math.isinf(df):
        return 0.5 * (1 + math.erf(t / math.sqrt(2)))
    tail = 0.5 * _regularized_beta(df / (df + t * t), df / 2, 0.5)  # P(T > |t|)
    return 1 - tail if t > 0 else tail


def t_quantile(probability: float, df: float) -> float:
    """The t with P(T <= t) = probability (bisection on `t_cdf`: exact to 1e-10)."""
    if not 0 < probability < 1:
        raise ValueError(f"probability {probability}: must be strictly between 0 and 1")
    if probability < 0.5:
        return -t_quantile(1 - probability, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < probability:
        high *= 2
    while high - low > 1e-10 * max(1.0, high):
        middle = (low + high) / 2
        low, high = (middle, high) if t_cdf(middle, df) < probability else (low, middle)
    return (low + high) / 2


def _regularized_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b), by its continued fraction (modified Lentz), on the side where it converges."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x > (a + 1) / (a + b + 2):
        return 1 - _regularized_beta(1 - x, b, a)
    return math.exp(log_front) * _beta_fraction(x, a, b) / a


def _beta_fraction(x: float, a: float, b: float) -> float:
    tiny = 1e-300
    c, d = 1.0, 1 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 500):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1 + numerator * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1) < 1e-15:
            break
    return result
