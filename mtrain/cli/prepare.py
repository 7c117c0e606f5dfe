"""`mtrain prepare`: train the tokenizer and encode the corpus into the cache, nothing else.

Useful before a multi-GPU job (every rank then loads the cache in seconds) and to check a
corpus: it prints pairs read, filtered by reason, kept, tokens per side and the time taken.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from mtrain.cli.common import CONFIG_DIR, user_errors_as_messages


@hydra.main(config_path=CONFIG_DIR, config_name="prepare", version_base="1.3")
@user_errors_as_messages
def main(cfg: DictConfig) -> None:
    from mtrain.data.prepare import prepare_data

    prepared = prepare_data(cfg.data, cfg.tokenizer, log=lambda message: print(message, flush=True))
    print(f"prepared: {prepared.directory}", flush=True)


if __name__ == "__main__":
    main()
