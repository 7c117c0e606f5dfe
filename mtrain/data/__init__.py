"""Parallel corpora: sources (local files, the Hub), cleaning, the encoded on-disk store,
preparation and token-budget batching.

The names below are imported on first use (PEP 562) rather than here: encoding worker
processes import `mtrain.data.encoding`, and loading torch (for `Batch`) in each of them
would cost seconds and hundreds of megabytes apiece.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "prepare_data": "prepare",
    "PreparedData": "prepare",
    "EncodedCorpus": "corpus",
    "ParallelText": "sources",
    "resolve_source": "sources",
    "Batch": "batching",
    "TokenBatchSampler": "batching",
    "collate": "batching",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'mtrain.data' has no attribute '{name}'")
    return getattr(importlib.import_module(f"mtrain.data.{_EXPORTS[name]}"), name)
