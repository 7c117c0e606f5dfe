"""`model.output_vocab=target`: the output softmax ranges over the pieces of the training targets.

With a joint vocabulary about half of the pieces only ever occur on the source side (Multi30k
de-en, 8k SentencePiece: 3,958 of 8,000 occur in the English targets). The decoder is never
trained to emit them, yet a full softmax multiplies their rows, normalises over them and
computes their gradients at every target token. Restricting the softmax to the pieces of the
training targets (and eos, and unk so the model can still say it does not know) halves the
output projection's work in training and decoding; the restriction is fixed when training
starts and saved with the model (`Seq2SeqTransformer.output_allowed`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from mtrain.batches import EncodedCorpus
from mtrain.config import OutputVocab
from mtrain.model import Seq2SeqTransformer
from mtrain.tokenizer import SpecialIds

log = logging.getLogger("mtrain")


def restrict_to_training_targets(
    model: Seq2SeqTransformer,
    output_vocab: OutputVocab,
    train: EncodedCorpus,
    special_ids: SpecialIds,
    copies: Sequence[EncodedCorpus] = (),
    keep: Sequence[int] = (),
) -> int | None:
    """Restrict `model`'s softmax when the config asks for it; returns the pieces kept (None: all).

    `copies`: the sampled segmentations training also sees (`data.subword_sampling`), whose
    targets use pieces that the deterministic segmentation may never produce. `keep`: pieces
    kept besides (a fine-tune's: those its parent could emit, `mtrain.train.init_from`)."""
    if output_vocab != OutputVocab.target:
        return None
    pieces = np.union1d(train.target_pieces(), [special_ids.eos, special_ids.unk, *keep])
    for copy in copies:
        pieces = np.union1d(pieces, copy.target_pieces())
    kept = model.restrict_output(pieces.tolist())
    log.info(
        "output vocabulary: %d of %d pieces (model.output_vocab=target: those of the training targets%s)",
        kept,
        model.tgt_vocab_size,
        f" and the {len(keep)} its parent could emit" if len(keep) else "",
    )
    return kept
