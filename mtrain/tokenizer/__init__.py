"""SentencePiece tokenization: the `Tokenizer` of a run and its cached training."""

from mtrain.tokenizer.tokenizer import Tokenizer
from mtrain.tokenizer.training import train_or_load_tokenizer

__all__ = ["Tokenizer", "train_or_load_tokenizer"]
