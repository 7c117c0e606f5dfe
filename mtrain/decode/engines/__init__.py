"""Engines: a batch of encoded sources in, hypotheses out (above `mtrain.decode.search`).

- `engine.py`: the `Engine` protocol, the contract every layer above is written against, and
  `as_engine`; `torch_engine.py`: mtrain's model through `generate`; `ensemble.py`: several
  models as one; `ct2_engine.py`: a CTranslate2 export;
- `directions.py`: a run's languages and each direction's tokenizer (what an engine translates);
- `threads.py`: the thread rule of every decode.
"""
