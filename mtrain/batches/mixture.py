"""Training on several corpora at once: each a `CorpusPart` with a weight.

(Issue 29: the draw of each epoch by weight and temperature lives here.)
"""

from __future__ import annotations

from dataclasses import dataclass

from mtrain.batches.corpus import EncodedCorpus


@dataclass(frozen=True)
class CorpusPart:
    """One training corpus as prepared: its label (data.corpora[i].name, or data.name), its
    direction, the encoded training pairs (tags already at the start of each source), its
    weight and tag (CorpusConfig)."""

    name: str
    src: str
    tgt: str
    corpus: EncodedCorpus
    weight: float = 1.0
    tag: str | None = None
