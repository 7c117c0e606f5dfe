"""The Transformer encoder-decoder and its incremental decoding state.

Files, in reading order: `transformer.py` (the model top to bottom), `layers.py` (the
standard Pre-LN encoder and decoder layers), `attention.py`, `feedforward.py`,
`embeddings.py`, `positions.py`, `dropout.py` (a CPU-cheap dropout), `precision.py`
(autocast's compute dtype), `state.py` (the decoding cache), `build.py` (config checks),
`variants.py` (the ablation bench's layer variants: post-norm, normalised residual, decoder
orders), `flops.py` (FLOPs per token), `instruments.py` (activation statistics, attached by
hooks).
"""

from mtrain.config import check_model_config
from mtrain.model.build import build_model
from mtrain.model.instruments import StatisticsRecorder
from mtrain.model.state import DecoderState
from mtrain.model.transformer import Seq2SeqTransformer

__all__ = ["DecoderState", "Seq2SeqTransformer", "StatisticsRecorder", "build_model", "check_model_config"]
