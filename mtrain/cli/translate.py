"""`mtrain translate`: translate a file or stdin with a trained run.

    mtrain translate run=RUN_DIR input=test.de output=test.en decode.beam=5
    cat input.de | mtrain translate run=RUN_DIR > output.en
    mtrain translate run=RUN_DIR input=test.de decode.nbest=5 decode.beam=5   # n-best TSV
    mtrain translate run=RUN_DIR input=some.de attention=att/ attention_layer=all
    mtrain translate run=RUN_DIR input=test.de engine=ctranslate2 [precision=int8]
    mtrain translate run=EXPORTED_DIR input=test.de engine=ctranslate2   # from `mtrain export`

Writes nothing but the translations to stdout (logs and the progress bar go to stderr) and
creates no Hydra output directory. The work is in `mtrain.decode.stream`.
"""

from __future__ import annotations

import logging
import os
import sys

from omegaconf import DictConfig

from mtrain.cli.common import mtrain_app
from mtrain.errors import MtrainError

log = logging.getLogger("mtrain.translate")


def run_translate(cfg: DictConfig) -> None:
    """Load the run's model and tokenizer and translate as `cfg` (a TranslateConfig) says."""
    from mtrain.decode.stream import translate_stream
    from mtrain.decode.textio import check_paths
    from mtrain.decode.translator import resolve_decode_precision
    from mtrain.decode.threads import set_decode_threads
    from mtrain.train.checkpoint import load_run
    from mtrain.runtime import resolve_device

    if cfg.run is None:
        raise MtrainError("run=RUN_DIR is missing: give the directory `mtrain fit` wrote (outputs/DATE/TIME)")
    if cfg.engine not in ("torch", "ctranslate2"):
        raise MtrainError(f"engine={cfg.engine}: choose torch or ctranslate2")
    check_paths(cfg.input, cfg.output)  # before the model loads
    threads = set_decode_threads(cfg.num_threads)
    device = resolve_device(cfg.device)
    if cfg.engine == "ctranslate2":
        from mtrain.export.engine import open_ctranslate2

        # run= may also be a directory written by `mtrain export`.
        model = open_ctranslate2(cfg.run, cfg.checkpoint, device, cfg.precision, threads)
        log.info("translating with CTranslate2: %s on %s, beam %d", model.description, device, cfg.decode.beam)
        report = translate_stream(model, model.tokenizer, cfg, device, cfg.precision)
        log.info("translated %d lines", report.lines)
        return
    precision = resolve_decode_precision(cfg.precision, device)
    loaded = load_run(cfg.run, which=cfg.checkpoint, device=device)
    log.info("translating with %s (update %d) on %s, %s, beam %d",
             loaded.checkpoint_path, loaded.update, device, precision, cfg.decode.beam)
    report = translate_stream(loaded.model, loaded.tokenizer, cfg, device, precision)
    log.info("translated %d lines", report.lines)


@mtrain_app("translate")
def main(cfg: DictConfig) -> None:
    try:
        run_translate(cfg)
    except BrokenPipeError:
        # The reader went away (`mtrain translate ... | head`): stop quietly, like cat does.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(141)


if __name__ == "__main__":
    main()
