"""Durations as users write them in configs ("90s", "20m", "2h"), read one way everywhere."""

from __future__ import annotations

import re

from mtrain.errors import MtrainError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


def parse_duration(text: str | None, key: str = "train.max_time") -> float | None:
    """'90s', '20m', '2h', '1.5h' or a bare number of seconds -> seconds (None stays None)."""
    if text is None or str(text).strip() == "":
        return None
    match = _DURATION.match(str(text))
    if not match:
        raise MtrainError(f"{key}={text!r}: not a duration; write e.g. 90s, 20m or 2h")
    return float(match.group(1)) * _SECONDS[match.group(2)]


def parse_budget_share(text: str | None, budget: str | float | None, key: str = "train.warmup_time") -> float | None:
    """A share of the time budget `budget` (a duration, or seconds) written as "N%" or as a
    duration ("60s"), as a fraction (0.09); None when either is unset. The range is checked by
    mtrain.config_checks."""
    if text is None or str(text).strip() == "" or budget is None:
        return None
    text = str(text).strip()
    if text.endswith("%"):
        try:
            return float(text[:-1]) / 100.0
        except ValueError:
            raise MtrainError(f"{key}={text!r}: not a share; write e.g. 9% or a duration such as 60s") from None
    seconds = budget if isinstance(budget, (int, float)) else parse_duration(budget)
    share = parse_duration(text, key)
    return None if seconds is None or share is None else share / max(seconds, 1e-9)


def format_duration(seconds: float) -> str:
    """Seconds as log lines write them: '45 s', '1m21s', '2h05m' (rounded to the second)."""
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
