"""A batch's controls as the step processors the generator calls.

`generate` takes a list of `StepProcessor`s (fairseq2's split: the loop knows the hooks, not
the rules); what a request asks of its translation (a target prefix, constraints, avoided
phrases, terms placed where their source words are read) arrives per sentence as `ControlIds`
and becomes that list here, once per batch: the engine calls `batch_processors` and hands the
result on, without a parameter per control.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from mtrain.config import DecodeConfig
from mtrain.config import TermPlacement as PlacementMode
from mtrain.decode.search.constraints import ControlIds, controls_for
from mtrain.decode.search.placement import PlacementVocab, placement_attention_layer, placement_for
from mtrain.decode.search.processors import NeverEmitted, StepProcessor

if TYPE_CHECKING:
    from mtrain.tokenizer import Tokenizer


@dataclass(frozen=True)
class VocabRules:
    """What the target vocabulary tells every batch's processors, found once per engine."""

    never_emitted: tuple[int, ...] = ()  # besides pad and bos: a multilingual run's tags
    # Pieces that continue a word: none follows a completed constraint, so constraints end at
    # a word's end (empty: a constraint may end inside a word).
    word_continuations: tuple[int, ...] = ()
    placement: PlacementVocab | None = None  # the pieces term placement reads (None: no placement)

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> VocabRules:
        """A tokenizer's: its tags (`Tokenizer.tag_ids`), word continuations and pieces."""
        return cls(
            never_emitted=tuple(tokenizer.tag_ids),
            word_continuations=tuple(tokenizer.word_continuation_ids()),
            placement=PlacementVocab.of(tokenizer.tgt_pieces(range(tokenizer.tgt_vocab_size))),
        )


def batch_processors(
    cfg: DecodeConfig,
    rules: VocabRules,
    controls: Sequence[ControlIds | None] | None,
    src_tokens: Tensor,
    eos_id: int,
    decoder_depth: int | None = None,
) -> list[StepProcessor]:
    """The processors a batch (`src_tokens` (batch, src_len)) decodes with beyond those every
    decode has (`generate`'s own): the vocabulary's banned tokens, then the sentences' controls
    (`controls`, per sentence; None or all empty: none), then term placement where
    `decode.term_placement=aligned` and a constraint came from a term (reading the attention of
    `placement_attention_layer` of a decoder `decoder_depth` layers deep)."""
    device = src_tokens.device
    processors: list[StepProcessor] = []
    if rules.never_emitted:
        processors.append(NeverEmitted(torch.tensor(rules.never_emitted, dtype=torch.long, device=device)))
    target = controls_for(controls, device, eos_id, rules.word_continuations) if controls is not None else None
    if target is None:
        return processors
    processors.append(target)
    placing = rules.placement is not None and PlacementMode(cfg.term_placement) is PlacementMode.aligned
    if placing and target.has_constraints:
        assert rules.placement is not None and controls is not None  # (placing; a target)
        given = [c or ControlIds() for c in controls]
        layer = placement_attention_layer(cfg, decoder_depth)
        placement = placement_for(target, given, src_tokens.size(1), rules.placement, layer)
        if placement is not None:
            processors.append(placement)
    return processors
