"""Selection: one translation chosen among an engine's candidates (above `mtrain.decode.engines`).

- `utility.py`: sentence chrF/BLEU matrices; `mbr.py`: minimum Bayes risk;
- `rerank.py`: n-best reranking features and weights;
- `selecting.py`: `SelectingEngine`, MBR and reranking as an engine around an engine;
  `describe_search` for start lines.
"""
