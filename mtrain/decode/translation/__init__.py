"""Translation of sentences (above `mtrain.decode.selection`): sentences to token-budget
batches to an engine, hypotheses with `.text`.

- `translator.py`: `translate_sentences`, `translate_encoded`;
- `alignment.py`: word alignments from cross-attention;
- `cost.py`: what decoding a set will cost, measured before it is decoded;
- `confidence.py`: a translation's confidence score in [0, 1] (its mean token log-probability,
  calibrated on the run's validation set against sentence chrF).
"""
