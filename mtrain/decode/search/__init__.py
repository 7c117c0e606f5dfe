"""The search, the lowest layer of decoding: one step (scores in, choices out), the step
processors that edit a step's log-probabilities, and the generator loop that calls them.

- `hypothesis.py`: what decoding returns, length normalisation;
- `algorithms.py`: greedy and beam search, one step each; `sampling.py`: top-k / top-p /
  epsilon sampling as a search algorithm;
- `processors.py`: the `StepProcessor` hooks and the processors every decode has (tokens never
  emitted, length limits, no-repeat-ngram); `constraints.py`: a sentence's target prefix,
  constraints and avoided phrases as a step processor, and the constrained beam;
  `placement.py`: terms placed where the attention reads their source words;
- `step_functions.py`: logits from the KV cache, or full recomputation as a reference;
- `generator.py`: encode once, step until every sentence is done.

Nothing here imports another layer of `mtrain.decode` (pyproject.toml's decode contract).
"""
