"""`mtrain translate`: translate a file or stdin with a trained run.

    mtrain translate run=RUN_DIR input=test.de output=test.en decode.beam=5
    cat input.de | mtrain translate run=RUN_DIR > output.en
    mtrain translate run=RUN_DIR input=test.de decode.nbest=5 decode.beam=5   # n-best TSV
    mtrain translate run=RUN_DIR input=some.de attention=att/ attention_layer=all
    mtrain translate run=RUN_DIR input=test.de decode.alignment=true   # text<TAB>Pharaoh word alignment
    mtrain translate run=RUN_DIR input=test.de engine=ctranslate2 [precision=int8]
    mtrain translate run=EXPORTED_DIR input=test.de      # from `mtrain export`: CTranslate2 decodes it
    mtrain translate run=RUN_A ensemble=[RUN_B,c.pt] input=test.de    # an ensemble of 3 (run= and the members)
    mtrain translate run=RUN_DIR            # at a terminal: type a line, get its translation
    mtrain translate run=MULTILINGUAL_RUN tgt_lang=fr input=test.de   # a run with data.lang_tags: into French

Writes nothing but the translations to stdout (logs and the progress bar go to stderr) and
creates no Hydra output directory. The work is in `mtrain.decode.text.stream`. Ctrl-C stops it
with exit status 130 and one line on stderr, as a shell's commands stop.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from mtrain.cli.common import mtrain_app
from mtrain.config import AlignmentLevel, Engine, TranslateConfig, alignment_level
from mtrain.errors import MtrainError
from mtrain.wording import counted

log = logging.getLogger("mtrain.translate")


def run_translate(cfg: TranslateConfig) -> None:
    """Load the run's model and tokenizer and translate as `cfg` (a TranslateConfig) says."""
    from mtrain.data.provenance import provenance_path
    from mtrain.decode.engines.threads import describe_threads, set_decode_threads
    from mtrain.decode.requests.controls import check_prefix_lines, describe_controls, line_controls
    from mtrain.decode.selection.rerank import check_rerank_files
    from mtrain.decode.selection.selecting import describe_search
    from mtrain.decode.text.stream import translate_stream
    from mtrain.decode.text.textio import check_paths, check_spares_what_it_reads, check_streams
    from mtrain.decode.translation.alignment import resolve_alignment_source
    from mtrain.export.engine import open_engine
    from mtrain.runtime import describe_device, resolve_device, set_tf32

    if cfg.run is None:  # (with ensemble= the config check has said how an ensemble is written)
        raise MtrainError("run=RUN_DIR is missing: give the directory `mtrain fit` wrote (outputs/DATE/TIME)")
    check_streams(cfg.input is None, cfg.output is None)  # before the model loads
    check_rerank_files(cfg.decode, cfg.run)
    check_paths(cfg.input, cfg.output)
    if cfg.output is not None:  # neither the translation nor its record may replace what is read
        reads = [("input", cfg.input), ("run", cfg.run), ("checkpoint", cfg.checkpoint)]
        reads += [("ensemble", member) for member in cfg.ensemble]
        record = provenance_path(Path(cfg.output))
        check_spares_what_it_reads(cfg.output, f"output={cfg.output}", reads)
        check_spares_what_it_reads(record, f"output={cfg.output}: its record {record.name}", reads)
    # What the outputs must start with, contain and avoid: read and checked before the model loads.
    controls = line_controls(str(cfg.constraints), cfg.terms, cfg.terms_ignore_case, cfg.avoid)
    if cfg.prefix is not None:
        check_prefix_lines(cfg.prefix, cfg.input)
    threads = set_decode_threads(cfg.num_threads)  # said once, below, when the model is open
    device = resolve_device(cfg.device)
    set_tf32(device, cfg.tf32)
    # run= may also be a directory written by `mtrain export` (decoded by CTranslate2, announced).
    engine = open_engine(
        cfg.run,
        cfg.engine,
        device,
        cfg.precision,
        threads,
        cfg.checkpoint,
        cfg.weights,
        ensemble=cfg.ensemble,
        announce=log.info,
    )
    # A multilingual run: the target language's tag starts every source (mtrain.decode.engines.directions).
    tokenizer = engine.tokenizer_for(cfg.tgt_lang)
    resolve_alignment_source(  # (format=xml|html aligns too)
        cfg.decode,
        engine.loaded.config if engine.loaded else None,
        engine.engine == Engine.ctranslate2,
        used=alignment_level(cfg.decode.alignment) is not AlignmentLevel.none or cfg.format != "text",
    )
    described = describe_controls(controls, cfg.prefix, cfg.terms, cfg.avoid, str(cfg.format))
    log.info(
        "translating with %s on %s, engine=%s, %s, %s%s%s",
        engine.description,
        describe_device(device, cfg.tf32),
        engine.engine,
        describe_search(cfg.decode),
        describe_threads(threads, chosen=cfg.num_threads is not None),
        f", {described}" if described else "",
        f", every source starting with {' '.join(tokenizer.src_pieces(tokenizer.source_prefix))}"
        if tokenizer.source_prefix
        else "",
    )
    report = translate_stream(
        engine.model, tokenizer, cfg, device, engine.precision, controls, engine.engine == Engine.ctranslate2
    )
    log.info("translated %s", counted(report.lines, "line"))
    if report.controls.summary():
        log.info("%s", report.controls.summary())
    if cfg.output is not None:  # which model made this file, for a corpus built from it (back-translation)
        from mtrain import installed_version
        from mtrain.config import to_plain
        from mtrain.data.provenance import write_provenance

        settings = {
            **to_plain(cfg.decode),
            "engine": str(to_plain(engine.engine)),
            "precision": engine.precision,
            "checkpoint": cfg.checkpoint,
            "weights": str(to_plain(cfg.weights)),
            "tgt_lang": cfg.tgt_lang,
        }
        write_provenance(
            Path(cfg.output),
            cfg.run,
            [member.checkpoint_path for member in engine.members],
            settings,
            cfg.input,
            installed_version(),
        )


@mtrain_app("translate")
def _app(cfg: TranslateConfig) -> None:
    try:
        run_translate(cfg)
    except BrokenPipeError:
        # The reader went away (`mtrain translate ... | head`): stop quietly, like cat does.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(141)
    except KeyboardInterrupt:
        # Ctrl-C, most often at an interactive prompt: what was translated is written already.
        print("\nmtrain: interrupted", file=sys.stderr)
        sys.exit(130)


def main() -> None:
    from mtrain.cli.overrides import friendly_overrides

    # `ensemble=B` and `ensemble=B,C` as users type them (Hydra wants a list: ensemble=[B,C]).
    sys.argv = sys.argv[:1] + friendly_overrides(sys.argv[1:], list_keys=("ensemble",), string_keys=())
    _app()


if __name__ == "__main__":
    main()
