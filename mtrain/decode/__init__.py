"""Decoding: search algorithms, the generator loop, and translation of sentences and files.

Files, in reading order: `hypothesis.py` (what decoding returns, length normalisation),
`search.py` (greedy and beam search: one step, scores in, choices out), `sampling.py`
(top-k / top-p sampling as a search algorithm), `processors.py` (step processors: length
limits, no-repeat-ngram), `step_functions.py` (logits from the KV cache, or full
recomputation as a reference), `generator.py` (the decoding loop), `torch_engine.py` and
`ct2_engine.py` (the two engines: a batch of encoded sources in, hypotheses out),
`translator.py` (sentences -> token-budget batches -> an engine -> hypotheses), `textio.py` (raw text in and out),
`stream.py` (`mtrain translate`: a file or stdin to a file or stdout), `attention_plot.py`
(cross-attention heat maps).
"""

from mtrain.decode.generator import generate
from mtrain.decode.hypothesis import Hypothesis, length_normalise
from mtrain.decode.translator import translate_encoded, translate_sentences

__all__ = ["Hypothesis", "generate", "length_normalise", "translate_encoded", "translate_sentences"]
