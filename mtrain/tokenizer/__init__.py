"""SentencePiece tokenization: the `Tokenizer` of a run, its `SpecialIds`, and its cached training."""

from mtrain.tokenizer.tokenizer import SpecialIds, Tokenizer
from mtrain.tokenizer.training import train_or_load_tokenizer

__all__ = ["SpecialIds", "Tokenizer", "train_or_load_tokenizer"]
