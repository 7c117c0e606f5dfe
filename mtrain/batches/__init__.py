"""Encoded corpora and their batches: the corpus through the tokenizer into a memory-mapped
store (`prepare`), and token-budget batches of it for teacher forcing (`batching`).

The names below are imported on first use (PEP 562) rather than here: encoding worker
processes import `mtrain.batches.encoding`, and loading torch (for `Batch`) in each of them
would cost seconds and hundreds of megabytes apiece.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "prepare_data": "prepare",
    "PreparedData": "prepare",
    "EncodedCorpus": "corpus",
    "Batch": "batching",
    "TokenBatchSampler": "batching",
    "collate": "batching",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'mtrain.batches' has no attribute '{name}'")
    return getattr(importlib.import_module(f"mtrain.batches.{_EXPORTS[name]}"), name)
