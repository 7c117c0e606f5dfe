"""What the tests of data preparation share: a log that says nothing, and the comparison of two
encoded corpora token for token."""

from __future__ import annotations

import numpy as np


def silent(_message: str) -> None:
    """A `log` for prepare_data that drops its messages."""


def same_arrays(a, b) -> bool:
    """Whether two encoded corpora hold the same tokens at the same offsets, on both sides."""
    return all(
        np.array_equal(getattr(a, name), getattr(b, name))
        for name in ("src_tokens", "src_offsets", "tgt_tokens", "tgt_offsets")
    )
