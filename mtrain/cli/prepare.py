"""`mtrain prepare`: train the tokenizer and encode the corpora into the cache, nothing else.

Useful before a multi-GPU job (every rank then loads the cache in seconds) and to check a
corpus: it prints pairs read, filtered by reason, kept, tokens per side and the time taken.
With `init_from=` (a fine-tune's overrides) the parent's tokenizer encodes, as `mtrain fit` does.
"""

from __future__ import annotations

from mtrain.cli.common import mtrain_app
from mtrain.config import FitConfig


@mtrain_app("prepare")
def main(cfg: FitConfig) -> None:
    from mtrain.batches.prepare import prepare_data
    from mtrain.config import with_resolved_model
    from mtrain.train.init_from import inherited_config, load_parent

    tokenizer = None
    if cfg.init_from is not None:
        parent = load_parent(cfg.init_from, cfg.init_weights, False, cfg.data, cfg.init_vocab)
        cfg = inherited_config(with_resolved_model(cfg), parent.config, (), f"init_from={cfg.init_from}")
        tokenizer = parent.tokenizer
    prepared = prepare_data(
        cfg.data, cfg.tokenizer, log=lambda message: print(message, flush=True), tokenizer=tokenizer
    )
    for part in prepared.train_parts:  # one cache entry per training corpus (the first is `directory`)
        assert part.corpus.directory is not None  # (cached on disk)
        print(f"prepared: {part.corpus.directory.parent}", flush=True)


if __name__ == "__main__":
    main()
