"""`mtrain eval`: score a run (decode + sacreBLEU), a hypothesis file, or compare runs.

    mtrain eval run=RUN split=test [average_last=3]     decode, score, write RUN/eval/test.*
    mtrain eval run=RUN split=test lowercase=true        scored otherwise: RUN/eval/test.lc.* (test.* stays)
    mtrain eval run=RUN split=test out=DIR               the same, written into DIR (a read-only run)
    mtrain eval run=RUN ensemble=[RUN_B,c.pt] out=DIR    an ensemble of run= and the members, report in DIR
    mtrain eval hyp=out.en ref=test.en                   score a file (ref=[a,b]: several)
    mtrain eval run=RUN split=test per_sentence=true     also RUN/eval/test.sentences.tsv, worst lines in test.md
    mtrain eval hyp=out.en ref=test.en per_sentence=true out.en.sentences.tsv beside out.en (or in out=DIR)
    mtrain eval run=RUN split=test terms=glossary.tsv    decode with the glossary's terms as constraints, term metrics too
    mtrain eval hyp=out.en ref=test.en src=test.de terms=glossary.tsv   a file's term metrics beside BLEU
    mtrain eval runs=SWEEP_DIR [baseline=NAME]           compare runs, paired bootstrap (arms over seeds)
    mtrain eval run=MULTILINGUAL src_lang=de tgt_lang=fr split=test   one direction (zero-shot too): eval/test.de-fr.*
    mtrain eval runs=MULTI,BILINGUAL src_lang=de tgt_lang=en  compare one direction (a multilingual run's, a bilingual run's)

The command's body, mode by mode: the engine is opened by `mtrain.export.engine.open_engine`
(as for `mtrain translate`), the split scored by `mtrain.evaluate.scoring.score_split`, its
report written by `mtrain.evaluate.report`.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mtrain.cli.common import mtrain_app
from mtrain.cli.overrides import friendly_overrides
from mtrain.config import Engine, EvalConfig, to_plain, with_values
from mtrain.config_checks import check_writable_dir
from mtrain.errors import MtrainError
from mtrain.rundir import RunDir, is_export_dir
from mtrain.wording import counted

if TYPE_CHECKING:
    from mtrain.decode.engines.directions import RunLanguages
    from mtrain.evaluate.terminology import GlossaryFile

log = logging.getLogger("mtrain")


def run_eval(cfg: EvalConfig) -> dict[str, Any]:
    """Dispatch to one of the three modes; returns what was computed (for tests and scripts)."""
    from mtrain.evaluate.metrics import check_metric_names

    check_metric_names(cfg.metrics)
    if cfg.runs:
        if cfg.run or cfg.hyp:
            raise MtrainError("runs=... compares runs; do not combine it with run= or hyp=")
        return compare(cfg)
    if cfg.hyp:
        return score_hypotheses(cfg)
    if cfg.run:
        return evaluate_run(cfg)
    raise MtrainError("nothing to evaluate: give run=RUN_DIR, hyp=FILE ref=FILE, or runs=SWEEP_DIR")


def evaluate_run(cfg: EvalConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """`run=`: decode `cfg.split` of `cfg.run` (its `checkpoint`, or the average of its last
    `average_last`; with `ensemble`, that and the members together), score it, write
    `eval/<split>.{json,md,hyp}` (or into `out`; scored with other than sacreBLEU's defaults:
    `eval/<split>.lc.*` and the like, `scored_report_name`); the report."""
    from mtrain.decode.engines.threads import describe_threads, set_decode_threads
    from mtrain.decode.requests.pipeline import FieldNames, Options, RequestPipeline, with_options
    from mtrain.decode.selection.rerank import check_rerank_files
    from mtrain.decode.selection.selecting import describe_search
    from mtrain.decode.translation.alignment import AlignmentLevel, alignment_level, resolve_alignment_source
    from mtrain.evaluate.average import average_to_file, default_average_path, last_checkpoints
    from mtrain.evaluate.metrics import check_metric_names
    from mtrain.evaluate.references import SplitText, read_reference_files, read_run_split
    from mtrain.evaluate.runs import run_config
    from mtrain.evaluate.scoring import score_split
    from mtrain.export.engine import open_engine
    from mtrain.runtime import describe_device, resolve_device, set_tf32

    metrics = check_metric_names(cfg.metrics)
    assert cfg.run is not None  # (main: run= chose this mode)
    glossary = read_glossary_file(cfg)
    run = RunDir(cfg.run)
    if not run.path.is_dir():
        raise MtrainError(f"run={run.path}: no such run directory")
    report_dir = check_output_dirs(run, cfg)  # before any averaging or decoding
    check_rerank_files(cfg.decode, run.path)
    exported = is_export_dir(run.path)  # an `mtrain export` directory: CTranslate2 decodes its one model
    if exported and cfg.average_last > 0:
        raise MtrainError(
            f"average_last={cfg.average_last}: run={run.path} is a CTranslate2 model written by `mtrain export`, "
            "one model; average a run's checkpoints (run=RUN_DIR average_last=N), or export the average"
        )
    device = resolve_device(cfg.device)
    set_tf32(device, cfg.tf32)
    averaged_from: list[str] | None = None
    split: SplitText | None = None
    checkpoint: str | Path
    if cfg.average_last > 0:
        sources_ckpts = last_checkpoints(run.path, cfg.average_last)
        # A run trained without the split, or a direction it cannot translate, is refused before an average is written.
        data_cfg = run_config(run.path).data
        split = read_run_split(run, data_cfg, cfg.split, scored_direction(cfg, _languages(data_cfg))[0])
        checkpoint = average_to_file(sources_ckpts, default_average_path(run.path, cfg.average_last, cfg.out))
        averaged_from = [str(path) for path in sources_ckpts]
        log(f"averaged {', '.join(p.name for p in sources_ckpts)} into {checkpoint}")
    else:
        checkpoint = cfg.checkpoint if exported else run.find_checkpoint(cfg.checkpoint)
    threads = set_decode_threads(cfg.num_threads)  # once there is something to decode
    engine = open_engine(
        run.path,
        cfg.engine,
        device,
        cfg.precision,
        threads,
        checkpoint,
        cfg.weights,
        ensemble=cfg.ensemble,
        announce=log,
    )
    if engine.loaded is not None:
        run_data, split_run = engine.loaded.config.data, run
        checkpoint_info = {
            "path": str(checkpoint),
            "which": "average" if averaged_from else cfg.checkpoint,
            "update": engine.loaded.update,
            "averaged_from": averaged_from,
            "weights": engine.loaded.weights,
        }
    else:
        run_data, split_run, checkpoint_info = exported_model(run, engine.model.metadata)
    if engine.languages is None:  # an export written before exports recorded their languages
        raise MtrainError(f"run={run.path}: the export does not record its languages; export the run again to score it")
    direction, tgt_lang = scored_direction(cfg, engine.languages)
    data_cfg = run_data
    if direction is not None:  # a multilingual run's direction: its own report, its languages in it
        data_cfg = with_values(data_cfg, src=direction[0], tgt=direction[1])
    if split is None:
        split = read_run_split(split_run, run_data, cfg.split, direction)
    if cfg.ref:  # explicit references replace the split's (e.g. extra references)
        given = read_reference_files(list(cfg.ref), cfg.max_line_chars)
        split = SplitText(split.sources, given.references, [split.files[0]] + given.files)
    log(
        f"decoding {counted(len(split.sources), 'sentence')} of {cfg.split} with "
        f"{engine.description if cfg.ensemble or exported else checkpoint} ({describe_search(cfg.decode)}, "
        f"{describe_device(device, cfg.tf32)}, "
        f"{engine.precision}, engine={engine.engine}, {describe_threads(threads, chosen=cfg.num_threads is not None)})"
    )
    if cfg.ensemble:  # run='s checkpoint (above) first, then the other members
        checkpoint_info["ensemble"] = [
            {"path": str(member.checkpoint_path), "update": member.update} for member in engine.members
        ]
    decode_info = {
        **to_plain(cfg.decode),
        "device": str(device),
        "precision": engine.precision,
        "engine": str(engine.engine),
        "threads": threads,
    }
    resolve_alignment_source(
        cfg.decode,
        engine.loaded.config if engine.loaded else None,
        engine.engine == Engine.ctranslate2,
        used=alignment_level(cfg.decode.alignment) is not AlignmentLevel.none,
    )
    # The request pipeline, as translate and serve decode (mtrain.decode.requests.pipeline): the whole split one request.
    pipeline = RequestPipeline(
        engine.model,
        engine.tokenizer_for(tgt_lang),
        device,
        engine.precision,
        ctranslate2=engine.engine == Engine.ctranslate2,
    )
    # (what a refusal names: eval's keys)
    names = FieldNames(alignment=f"decode.alignment={cfg.decode.alignment}", terms=f"terms={cfg.terms}")
    options = Options(with_options(cfg.decode), glossary=glossary.glossary if glossary else None, names=names)
    translate = pipeline_translator(pipeline, options)
    alignments: list[str] = []  # with decode.alignment: each hypothesis' links, for <split>.align
    if alignment_level(cfg.decode.alignment) is not AlignmentLevel.none:
        translate = collecting_alignments(translate, alignments)
    report_name = scored_report_name(
        cfg, cfg.split if direction is None else f"{cfg.split}.{direction[0]}-{direction[1]}"
    )
    if _scoring_settings(cfg):
        log(
            f"scoring with {_scoring_settings(cfg)}: the report is {report_name}.*, beside any of the "
            "default scoring (which `mtrain report` reads)"
        )
    report = score_split(
        run,
        cfg.split,
        data_cfg,
        split,
        translate,
        checkpoint_info,
        decode_info,
        metrics,
        cfg.tokenize,
        cfg.lowercase,
        cfg.chrf_word_order,
        log,
        report_dir,
        cfg.per_sentence,
        cfg.worst_lines,
        report_name=report_name,
        glossary=glossary,
    )
    if pipeline.stats.summary():  # (terms: how many were found and met)
        log(str(pipeline.stats.summary()))
    if alignments:
        from mtrain.rundir import atomic_write_text

        path = report_dir / f"{report_name}.align"
        atomic_write_text(path, "".join(line + "\n" for line in alignments))
        log(f"alignments (Pharaoh, line for line with {report_name}.hyp): {path}")
    return report


def pipeline_translator(pipeline: Any, options: Any) -> Callable[[list[str]], list[Any]]:
    """The best hypothesis per source sentence (a `mtrain.evaluate.scoring.Translate`), each
    sentence a request of `pipeline` decoded with `options`."""
    import torch

    from mtrain.decode.requests.request import DecodeRequest

    def translate(sources: list[str]) -> list[Any]:
        requests = [DecodeRequest(text, where=f"line {number}") for number, text in enumerate(sources, start=1)]
        with torch.inference_mode():
            return [hyps[0] for hyps in pipeline.translate(requests, options)]

    return translate


def collecting_alignments(translate: Any, alignments: list[str]) -> Any:
    """`translate` that also appends each best hypothesis' Pharaoh links to `alignments`."""
    from mtrain.decode.translation.alignment import pharaoh

    def translate_and_collect(sources: list[str]) -> Any:
        hypotheses = translate(sources)
        alignments.extend(pharaoh(hyp.alignment or []) for hyp in hypotheses)
        return hypotheses

    return translate_and_collect


def exported_model(run: RunDir, metadata: dict[str, Any]) -> tuple[Any, RunDir, dict[str, Any]]:
    """What an `mtrain export` directory (`run`) was exported from, by its metadata: the data
    config of its run, the run directory whose data/ holds the split (the run it came from, when
    it is still there; else `run`, whose split is then read as the data config says), and the
    report's checkpoint record (the exported checkpoint, its update and weights)."""
    from omegaconf import OmegaConf

    if not isinstance(metadata.get("data"), dict):
        raise MtrainError(
            f"run={run.path}: this export does not record its run's data config (an older mtrain wrote it); "
            f"translate the split with `mtrain translate run={run.path}` and score the file with hyp=... ref=..."
        )
    from mtrain.export.portable import RELATIVE_TO_EXPORT, resolved_paths

    data, checkpoint = metadata["data"], Path(str(metadata.get("checkpoint", "")))
    if metadata.get("paths") == RELATIVE_TO_EXPORT:  # written relative to the export directory
        data, checkpoint = resolved_paths(data, run.path), Path(os.path.normpath(run.path / checkpoint))
    origin = RunDir(checkpoint.parent.parent)
    split_run = origin if checkpoint.parent.name == "checkpoints" and origin.data_dir.is_dir() else run
    record = {
        "path": str(checkpoint),
        "which": "export",
        "update": metadata.get("update"),
        "averaged_from": None,
        "weights": metadata.get("weights"),
        "export": str(run.path.resolve()),
    }
    return OmegaConf.create(data), split_run, record


def scored_report_name(cfg: EvalConfig, name: str) -> str:
    """`name` for a report of sacreBLEU's default scoring, else `name` and the settings that
    differ (`test.lc` for lowercase=true: mtrain.evaluate.report.scored_name)."""
    from mtrain.evaluate.report import scored_name

    return scored_name(name, str(cfg.tokenize), cfg.lowercase, cfg.chrf_word_order)


def _scoring_settings(cfg: EvalConfig) -> str:
    defaults = EvalConfig()
    return " ".join(
        f"{key}={str(getattr(cfg, key)).lower()}"
        for key in ("tokenize", "lowercase", "chrf_word_order")
        if getattr(cfg, key) != getattr(defaults, key)
    )


def _languages(data_cfg: Any) -> RunLanguages:
    from mtrain.decode.engines.directions import RunLanguages

    return RunLanguages.of(data_cfg)


def scored_direction(cfg: EvalConfig, languages: RunLanguages) -> tuple[tuple[str, str] | None, str]:
    """The direction `src_lang`/`tgt_lang` name, when the report must name it (a run of several
    directions, or a direction other than a bilingual run's own: None otherwise), and the
    language decoded into. MtrainError for a direction the run cannot translate."""
    direction = languages.direction(cfg.src_lang, cfg.tgt_lang)
    named = languages.is_multilingual() or direction not in languages.directions()
    return (direction if named else None), direction[1]


def check_output_dirs(run: RunDir, cfg: EvalConfig) -> Path:
    """Refuse, before any work, directories `run=` cannot write: the report's (`out`, else the
    run's eval/) and, with `average_last`, the averaged checkpoint's (`out`, else checkpoints/).
    The directory the report goes to."""
    if cfg.out is not None:
        check_writable_dir(Path(cfg.out), "out")
        return Path(cfg.out)
    writes = "the report" + (f" and average_last{cfg.average_last}.pt" if cfg.average_last > 0 else "")
    for directory in [run.eval_dir] + ([run.checkpoint_dir] if cfg.average_last > 0 else []):
        check_writable_dir(directory, f"run={run.path}", advice=f"write {writes} elsewhere with out=DIR")
    return run.eval_dir


def score_hypotheses(cfg: EvalConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """`hyp=FILE ref=FILE...`: score a hypothesis file; prints the table.

    With `run=` instead of `ref=`, the references are the run's `split` (and its sources go
    into the per-sentence TSV). `per_sentence` writes `<hyp file name>.sentences.tsv` beside
    the hypotheses, or into `out=`, and prints the worst lines.
    """
    from mtrain.decode.text.textio import check_spares_what_it_reads
    from mtrain.evaluate.metrics import aligned_lines, check_lengths, check_metric_names, read_lines, score_corpus
    from mtrain.evaluate.references import SplitText, file_record, read_run_split
    from mtrain.evaluate.report import metrics_table
    from mtrain.evaluate.runs import run_config
    from mtrain.evaluate.sentences import (
        per_sentence_record,
        score_sentences,
        sentences_path,
        worst_lines_table,
        write_sentences_tsv,
    )
    from mtrain.evaluate.terminology import terms_table

    metrics = check_metric_names(cfg.metrics)
    assert cfg.hyp is not None  # (main: hyp= chose this mode)
    glossary = read_glossary_file(cfg)
    hyp_path = Path(cfg.hyp)
    for ref in cfg.ref:
        if hyp_path.is_file() and Path(ref).is_file() and os.path.samefile(hyp_path, ref):
            raise MtrainError(
                f"ref={ref}: is the hyp= file itself ({hyp_path}); a file scored against itself says "
                "nothing: give the reference translation"
            )
    if cfg.ref and not (cfg.per_sentence or glossary is not None or cfg.src is not None):
        return score_hypothesis_file(cfg, metrics, log)  # nothing per sentence: streamed
    ref_files = [("ref", ref) for ref in cfg.ref]
    # Read side by side: a file shorter than another is refused where it ends, not after the longer.
    aligned = list(aligned_lines([("hyp", hyp_path), *ref_files], cfg.max_line_chars))
    hyps = [row[0] for row in aligned]
    tsv = None
    if cfg.per_sentence:
        tsv_dir = Path(cfg.out) if cfg.out is not None else hyp_path.parent
        check_writable_dir(
            tsv_dir,
            "out" if cfg.out is not None else f"hyp={hyp_path}",
            advice=None if cfg.out is not None else "write the sentence scores elsewhere with out=DIR",
        )
        tsv = sentences_path(tsv_dir, scored_report_name(cfg, hyp_path.name))
        reads = [("hyp", cfg.hyp), ("run", cfg.run), *(("ref", ref) for ref in cfg.ref)]
        check_spares_what_it_reads(tsv, f"the sentence scores {tsv}", reads)
    if cfg.ref:
        references = [[row[k] for row in aligned] for k in range(1, len(cfg.ref) + 1)]
        split = SplitText([], references, [file_record(Path(ref), "reference") for ref in cfg.ref])
        ref_names = [f"ref={path}" for path in cfg.ref]
    elif cfg.run:
        data_cfg = run_config(Path(cfg.run)).data
        split = read_run_split(RunDir(cfg.run), data_cfg, cfg.split, scored_direction(cfg, _languages(data_cfg))[0])
        ref_names = [record["path"] for record in split.files if "reference" in record["role"]]
    else:
        raise MtrainError("hyp=... needs references: ref=FILE (or ref=[FILE1,FILE2]), or run=RUN to use its split")
    check_lengths(len(hyps), [len(stream) for stream in split.references], f"hyp={hyp_path}", ref_names)
    sources: list[str] | None = split.sources if not cfg.ref else None  # ref= files come without their sources
    if cfg.src is not None:
        sources = read_lines(cfg.src, "src", cfg.max_line_chars)
        if len(sources) != len(hyps):
            raise MtrainError(
                f"src={cfg.src} has {len(sources)} lines but hyp={hyp_path} has {len(hyps)}; "
                "give the sources the hypotheses translate, line for line"
            )
        split.files.insert(0, file_record(Path(cfg.src), "source"))
    scores = score_corpus(hyps, split.references, metrics, cfg.tokenize, cfg.lowercase, cfg.chrf_word_order)
    log(metrics_table(scores).to_text())
    result: dict[str, Any] = {
        "hypotheses": file_record(hyp_path, "hypotheses"),
        "data": split.files,
        "sentences": len(hyps),
        "metrics": scores,
    }
    if glossary is not None:
        assert sources is not None  # (EvalConfig.check: terms= with hyp= has src= or run=)
        result["terms"] = glossary.record(sources, hyps, split.references[0])
        log(terms_table(result["terms"]).to_text())
    if tsv is not None:
        rows = score_sentences(hyps, split.references, sources, None, cfg.tokenize, cfg.lowercase, cfg.chrf_word_order)
        write_sentences_tsv(tsv, rows)
        result["per_sentence"] = per_sentence_record(tsv, rows, cfg.worst_lines)
        log(worst_lines_table(result["per_sentence"]["worst_lines"]).to_text())
        log(f"sentence scores: {tsv}")
    return result


def score_hypothesis_file(cfg: EvalConfig, metrics: list[str], log: Callable[[str], None] = print) -> dict[str, Any]:
    """`hyp=FILE ref=FILE...` with nothing scored per sentence (no per_sentence, terms= or src=):
    the files scored as they are read side by side (`mtrain.evaluate.metrics.score_stream`), so
    memory stays bounded however many lines they hold; the result `score_hypotheses` returns."""
    from mtrain.evaluate.metrics import aligned_lines, score_stream
    from mtrain.evaluate.references import file_record
    from mtrain.evaluate.report import metrics_table

    assert cfg.hyp is not None
    rows = aligned_lines([("hyp", cfg.hyp), *(("ref", ref) for ref in cfg.ref)], cfg.max_line_chars)
    scores, count = score_stream(
        ((row[0], row[1:]) for row in rows), metrics, cfg.tokenize, cfg.lowercase, cfg.chrf_word_order, f"hyp={cfg.hyp}"
    )
    log(metrics_table(scores).to_text())
    return {
        "hypotheses": file_record(Path(cfg.hyp), "hypotheses"),
        "data": [file_record(Path(ref), "reference") for ref in cfg.ref],
        "sentences": count,
        "metrics": scores,
    }


def read_glossary_file(cfg: EvalConfig) -> GlossaryFile | None:
    """`terms=`'s glossary (None without one), read before any work."""
    from mtrain.decode.requests.terminology import read_glossary
    from mtrain.evaluate.terminology import GlossaryFile

    if cfg.terms is None:
        return None
    return GlossaryFile(str(cfg.terms), read_glossary(cfg.terms, cfg.terms_ignore_case))


def compare(cfg: EvalConfig) -> dict[str, Any]:
    """`runs=`: the comparison table, with paired bootstrap on the runs' saved hypotheses."""
    from mtrain.evaluate.compare import compare_runs, comparison_notes
    from mtrain.evaluate.references import read_reference_files
    from mtrain.evaluate.runs import default_baseline, discover_runs, failure_notes

    if (cfg.src_lang is None) != (cfg.tgt_lang is None):
        raise MtrainError("runs= with src_lang or tgt_lang compares one direction: give both (src_lang=de tgt_lang=en)")
    direction = (cfg.src_lang, cfg.tgt_lang) if cfg.src_lang is not None and cfg.tgt_lang is not None else None
    assert cfg.runs is not None  # (main: runs= chose this mode)
    runs = discover_runs(cfg.runs)
    refs = read_reference_files(list(cfg.ref), cfg.max_line_chars).references if cfg.ref else None
    baseline = cfg.baseline or default_baseline(runs, str(to_plain(cfg.split)), direction)
    comparison = compare_runs(
        runs,
        refs,
        baseline,
        cfg.split,
        list(cfg.metrics),
        cfg.bootstrap_samples,
        cfg.tokenize,
        cfg.lowercase,
        cfg.chrf_word_order,
        direction,
    )
    print(comparison.table().to_text())
    if comparison.over_seeds:
        print(f"\nOver seeds ({len(comparison.over_seeds.arms)} arms):")
        print(comparison.over_seeds.table().to_text())
    for note in comparison_notes(comparison) + failure_notes(runs):
        print(note)
    return {"comparison": comparison}


@mtrain_app("eval")
def _app(cfg: EvalConfig) -> None:
    run_eval(cfg)


def main() -> None:
    sys.argv = sys.argv[:1] + friendly_overrides(sys.argv[1:])
    _app()


if __name__ == "__main__":
    main()
