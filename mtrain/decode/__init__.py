"""Decoding: search algorithms, the generator loop, engines, n-best selection, and one path from
a request (translate's lines, eval's split, either HTTP API) to the decoder.

Files, in reading order, bottom up (the layers of docs/DESIGN.md, "Decoding"):

- one step: `hypothesis.py` (what decoding returns, length normalisation), `search.py` (greedy
  and beam search: one step, scores in, choices out), `sampling.py` (top-k / top-p / epsilon
  sampling as a search algorithm), `processors.py` (step processors, the hooks the generator
  calls: tokens never emitted, length limits, no-repeat-ngram), `constraints.py` (a sentence's
  target prefix, constraints and avoided phrases as a step processor, and the constrained beam),
  `placement.py` (terms placed where the attention reads their source words, a step processor),
  `step_functions.py` (logits from the KV cache, or full recomputation as a reference);
- the loop: `generator.py` (encode once, step until every sentence is done);
- engines: `engine.py` (the `Engine` protocol and `as_engine`: the lowest contract),
  `torch_engine.py` (mtrain's model through `generate`), `ensemble.py` (several models as one),
  `ct2_engine.py` (CTranslate2);
- selection: `utility.py` (sentence chrF/BLEU matrices), `mbr.py` (minimum Bayes risk),
  `rerank.py` (n-best reranking features and weights), `selection.py` (`SelectingEngine`: MBR
  and reranking as an engine around an engine; `describe_search` for start lines);
- the translator: `alignment.py` (word alignments from cross-attention), `translator.py`
  (sentences -> token-budget batches -> an engine -> hypotheses with `.text`);
- the request pipeline: `terminology.py` (glossaries), `markup.py` (inline tags out and back),
  `controls.py` (what a request asks of its output, as text and as target ids),
  `pipeline.py` (`RequestPipeline`: the rules of `mtrain.decoding_rules`, markup, terms,
  controls, the decoder, tags back, what constraints and terms did);
- around the commands: `directions.py` (a run's languages and each direction's tokenizer),
  `textio.py` (raw text in and out), `stream.py` (`mtrain translate`: a file or stdin to a
  file or stdout, through the pipeline), `threads.py` (the thread rule of every decode),
  `progress.py` (a long decode's progress), `cost.py` (what decoding a set will cost),
  `attention_plot.py` (cross-attention heat maps).
"""

from mtrain.decode.generator import generate
from mtrain.decode.hypothesis import Hypothesis, length_normalise
from mtrain.decode.translator import translate_encoded, translate_sentences

__all__ = ["Hypothesis", "generate", "length_normalise", "translate_encoded", "translate_sentences"]
