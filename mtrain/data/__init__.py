"""Parallel corpora as raw text: where they come from (local files, the Hub), how they are
read and repaired, cleaning rules, and the on-disk cache that later stages key by content.

Encoding with the tokenizer and batching come after the tokenizer, in `mtrain.batches`.
"""

from mtrain.data.sources import ParallelText, resolve_source

__all__ = ["ParallelText", "resolve_source"]
