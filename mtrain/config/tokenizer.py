"""`tokenizer:` (configs/tokenizer/): the SentencePiece model trained (or reused) and its special ids."""

from __future__ import annotations

from dataclasses import dataclass

from mtrain.config.choice import Choice
from mtrain.config_fields import ranged
from mtrain.errors import MtrainError


class TokenizerModel(Choice):
    unigram = "unigram"
    bpe = "bpe"


@dataclass
class TokenizerConfig:
    # An existing tokenizer instead of training one (fairseq's --srcdict, Marian's --vocabs): a run
    # directory, its tokenizer/ or a cache entry. The settings below are then those of its files.
    # With the tokenizer fixed, a corpus added to data.corpora is the only one encoded.
    path: str | None = None
    vocab_size: int = ranged(8000, at_least=5, why="(room for unk, pad, bos, eos and at least one piece)")
    model_type: TokenizerModel = TokenizerModel.unigram
    joint: bool = True  # one vocabulary for both languages
    character_coverage: float = ranged(1.0, above=0, at_most=1)
    max_sentences: int = ranged(2_000_000, at_least=1)  # SentencePiece samples at most this many sentences
    # SentencePiece training threads. The trained model depends on the count (its EM sums
    # per-thread counts), so it is a setting of its own, part of the tokenizer's cache key,
    # and not the machine's core count: the same config gives the same tokenizer everywhere.
    num_threads: int = ranged(1, at_least=1)
    # Explicit special ids (JoeyNMT/fairseq-compatible layout).
    unk_id: int = 0
    pad_id: int = 1
    bos_id: int = 2
    eos_id: int = 3

    def check(self, prefix: str) -> None:
        special = {name: getattr(self, name) for name in ("unk_id", "pad_id", "bos_id", "eos_id")}
        for name, value in special.items():
            if not 0 <= value < self.vocab_size:
                raise MtrainError(f"{prefix}.{name}: {value} must be in [0, {prefix}.vocab_size={self.vocab_size})")
        if len(set(special.values())) < len(special):
            raise MtrainError(
                f"{prefix}.unk_id/pad_id/bos_id/eos_id: {list(special.values())} must be four different ids"
            )
