"""Translation of sentences (above `mtrain.decode.selection`): sentences to token-budget
batches to an engine, hypotheses with `.text`.

- `translator.py`: `translate_sentences`, `translate_encoded`;
- `alignment.py`: word alignments from cross-attention;
- `cost.py`: what decoding a set will cost, measured before it is decoded.
"""
