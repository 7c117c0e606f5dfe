"""`mtrain prepare`: train the tokenizer and encode the corpora into the cache, nothing else.

Useful before a multi-GPU job (every rank then loads the cache in seconds) and to check a
corpus: it prints pairs read, filtered by reason, kept, tokens per side and the time taken.
"""

from __future__ import annotations


from mtrain.cli.common import mtrain_app
from mtrain.config import FitConfig


@mtrain_app("prepare")
def main(cfg: FitConfig) -> None:
    from mtrain.batches.prepare import prepare_data

    prepared = prepare_data(cfg.data, cfg.tokenizer, log=lambda message: print(message, flush=True))
    for part in prepared.train_parts:  # one cache entry per training corpus (the first is `directory`)
        print(f"prepared: {part.corpus.directory.parent}", flush=True)


if __name__ == "__main__":
    main()
