"""Decoding: search algorithms, the generator loop, engines, n-best selection, and one path from
a request (translate's lines, eval's split, either HTTP API) to the decoder.

Its subpackages are layers, bottom up; each imports only those below it (pyproject.toml's
decode contract, run by tests/test_architecture.py; docs/DESIGN.md, "Decoding"):

- `search/`: one step (scores in, choices out), the step processors, the generator loop;
- `engines/`: the `Engine` protocol, the torch, ensemble and CTranslate2 engines, a run's
  directions, the thread rule;
- `selection/`: MBR and reranking, an engine around an engine;
- `translation/`: sentences to token-budget batches to an engine; word alignments; cost;
- `requests/`: glossaries, markup, controls, the request pipeline;
- `text/`: the commands' files and streams (`mtrain translate`'s body), progress, plots.
"""

from mtrain.decode.search.generator import generate
from mtrain.decode.search.hypothesis import Hypothesis, length_normalise
from mtrain.decode.translation.translator import translate_encoded, translate_sentences

__all__ = ["Hypothesis", "generate", "length_normalise", "translate_encoded", "translate_sentences"]
