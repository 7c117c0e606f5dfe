"""The lowest contract of decoding: an `Engine` decodes one batch of encoded sources.

Every layer of `mtrain/decode/` above the search is written against this protocol:
`TorchEngine` (mtrain's model through `generate`, `torch_engine.py`) and `CTranslate2Model`
(`ct2_engine.py`) implement it; `SelectingEngine` (`selection/selecting.py`: MBR and
reranking) wraps one and is one; the translator (`translation/translator.py`) batches
sentences for any of them. The decode contract (pyproject.toml) keeps every layer above
this one out of its imports.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

from mtrain.config import DecodeConfig, Precision
from mtrain.decode.engines.torch_engine import TorchEngine
from mtrain.decode.search.constraints import ControlIds
from mtrain.decode.search.hypothesis import Hypothesis
from mtrain.decode.search.steering import VocabRules

if TYPE_CHECKING:
    from mtrain.decode.engines.ensemble import EnsembleModel
    from mtrain.model import Seq2SeqTransformer
    from mtrain.tokenizer import Tokenizer

__all__ = ["Engine", "as_engine"]


@runtime_checkable
class Engine(Protocol):
    """Decodes one batch of encoded sources."""

    def translate_batch(
        self,
        sources: Sequence[Sequence[int]],
        cfg: DecodeConfig,
        attention_layer: int | str | None = None,
        controls: Sequence[ControlIds | None] | None = None,
    ) -> list[list[Hypothesis]]:
        """Per source (ids ending in eos, none empty), up to `cfg.nbest` hypotheses, best
        first; `.text` may be left empty (the translator detokenizes what is); `controls`
        (None: none), per source, its target prefix, constraints and avoided phrases
        (MtrainError for what the engine cannot honour)."""
        ...


def as_engine(
    model: Seq2SeqTransformer | EnsembleModel | Engine,
    tokenizer: Tokenizer,
    device: torch.device | str,
    precision: Precision | str = Precision.fp32,
    use_cache: bool = True,
) -> Engine:
    """`model` itself if it is an engine, else mtrain's model wrapped in a `TorchEngine`
    (which, for bf16/fp16, casts the weights once: build it once per decode, not per batch)
    that never emits the tokenizer's tags (`Tokenizer.tag_ids`, mtrain.decode.engines.directions)."""
    if isinstance(model, Engine):
        return model
    return TorchEngine(
        model,
        tokenizer.pad_id,
        tokenizer.bos_id,
        tokenizer.eos_id,
        device,
        precision,
        use_cache,
        rules=VocabRules.of(tokenizer),
    )
