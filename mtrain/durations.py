"""Durations as users write them in configs ("90s", "20m", "2h"), read one way everywhere."""

from __future__ import annotations

import re
from typing import Optional

from mtrain.errors import MtrainError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


def parse_duration(text: Optional[str], key: str = "train.max_time") -> Optional[float]:
    """'90s', '20m', '2h', '1.5h' or a bare number of seconds -> seconds (None stays None)."""
    if text is None or str(text).strip() == "":
        return None
    match = _DURATION.match(str(text))
    if not match:
        raise MtrainError(f"{key}={text!r}: not a duration; write e.g. 90s, 20m or 2h")
    return float(match.group(1)) * _SECONDS[match.group(2)]
