"""The Transformer encoder-decoder and its incremental decoding state.

Files, in reading order: `transformer.py` (the model top to bottom), `layers.py` (encoder
and decoder layers, residual connections, norms), `attention.py`, `feedforward.py`,
`embeddings.py`, `positions.py`, `dropout.py` (a CPU-cheap dropout), `state.py` (the
decoding cache), `build.py` (config checks), `flops.py` (FLOPs per token), `instruments.py`
(activation statistics for the ablation bench).
"""

from mtrain.model.build import build_model, check_model_config
from mtrain.model.state import DecoderState
from mtrain.model.transformer import Seq2SeqTransformer

__all__ = ["build_model", "check_model_config", "DecoderState", "Seq2SeqTransformer"]
