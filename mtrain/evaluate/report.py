"""`mtrain eval run=RUN split=test`: decode a run's split, score it, and write the report.

The report (`<run>/eval/<split>.json` and `.md`, hypotheses in `.hyp`) holds what a
reviewer needs to trust the number: each metric with its sacreBLEU signature, the
checkpoint (or averaged checkpoints), the decoding settings, the data files with their
hashes, the number of sentences, and how long decoding took.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from mtrain import __version__
from mtrain.config import to_plain
from mtrain.errors import MtrainError
from mtrain.evaluate.metrics import check_lengths, check_metric_names, read_lines, score_corpus
from mtrain.evaluate.references import SplitText, file_record, read_reference_files, read_run_split
from mtrain.evaluate.runs import run_config
from mtrain.evaluate.scoring import Translate, translate_and_score
from mtrain.evaluate.tables import Table
from mtrain.rundir import RunDir, atomic_write_text


def metrics_table(scores: Dict[str, Dict[str, Any]]) -> Table:
    table = Table(["metric", "score", "signature"])
    for values in scores.values():
        table.add(values["name"], float(values["score"]), values["signature"])
    return table


def score_hypotheses(cfg: Any, log: Callable[[str], None] = print) -> Dict[str, Any]:
    """`mtrain eval hyp=FILE ref=FILE...`: score a hypothesis file; prints the table.

    With `run=` instead of `ref=`, the references are the run's `split`.
    """
    metrics = check_metric_names(cfg.metrics)
    hyp_path = Path(cfg.hyp)
    hyps = read_lines(hyp_path, "hyp")
    if cfg.ref:
        split = read_reference_files(list(cfg.ref))
        ref_names = [f"ref={path}" for path in cfg.ref]
    elif cfg.run:
        split = read_run_split(RunDir(cfg.run), run_config(Path(cfg.run)).data, cfg.split)
        ref_names = [record["path"] for record in split.files if "reference" in record["role"]]
    else:
        raise MtrainError("hyp=... needs references: ref=FILE (or ref=[FILE1,FILE2]), or run=RUN to use its split")
    check_lengths(len(hyps), [len(stream) for stream in split.references], f"hyp={hyp_path}", ref_names)
    scores = score_corpus(hyps, split.references, metrics, cfg.tokenize, cfg.lowercase, cfg.chrf_word_order)
    log(metrics_table(scores).to_text())
    return {"hypotheses": file_record(hyp_path, "hypotheses"), "data": split.files,
            "sentences": len(hyps), "metrics": scores}


def evaluate_run(cfg: Any, log: Callable[[str], None] = print,
                 convert: Optional[Callable[..., Any]] = None) -> Dict[str, Any]:
    """Decode `cfg.split` of `cfg.run`, score it, write `eval/<split>.{json,md,hyp}`.

    `convert(loaded_run, device, precision, threads)` turns the loaded checkpoint into another
    engine for `engine=ctranslate2` (`mtrain.export.engine.convert_loaded`: export sits
    above evaluation in the pipeline, so the CLI passes it in).
    """
    from mtrain.decode.threads import set_decode_threads
    from mtrain.decode.translator import resolve_decode_precision
    from mtrain.evaluate.average import average_to_file, default_average_path, last_checkpoints
    from mtrain.train.checkpoint import load_run
    from mtrain.runtime import resolve_device

    metrics = check_metric_names(cfg.metrics)
    run = RunDir(cfg.run)
    if not run.path.is_dir():
        raise MtrainError(f"run={run.path}: no such run directory")
    if cfg.engine not in ("torch", "ctranslate2"):
        raise MtrainError(f"engine={cfg.engine}: choose torch or ctranslate2")
    device = resolve_device(cfg.device)
    # CTranslate2 also takes its own weight types (precision=int8); see mtrain.decode.ct2_engine.
    precision = resolve_decode_precision(cfg.precision, device) if cfg.engine == "torch" else cfg.precision

    averaged_from: Optional[List[str]] = None
    if cfg.average_last > 0:
        sources_ckpts = last_checkpoints(run.path, cfg.average_last)
        checkpoint = average_to_file(sources_ckpts, default_average_path(run.path, cfg.average_last))
        averaged_from = [str(path) for path in sources_ckpts]
        log(f"averaged {', '.join(p.name for p in sources_ckpts)} into {checkpoint}")
    else:
        checkpoint = run.find_checkpoint(cfg.checkpoint)
    loaded = load_run(run.path, device=device, checkpoint_path=checkpoint)
    model = loaded.model
    threads = set_decode_threads(cfg.num_threads)  # once there is something to decode
    if cfg.engine == "ctranslate2":  # the same checkpoint, converted
        if convert is None:
            raise MtrainError("engine=ctranslate2: this caller gave no converter for the checkpoint; use `mtrain eval`")
        model = convert(loaded, device, precision, threads)
        precision = model.translator.compute_type

    split = read_run_split(run, loaded.config.data, cfg.split)
    if cfg.ref:  # explicit references replace the split's (e.g. extra references)
        given = read_reference_files(list(cfg.ref))
        split = SplitText(split.sources, given.references, [split.files[0]] + given.files)
    log(f"decoding {len(split.sources)} sentences of {cfg.split} with {checkpoint} "
        f"(beam {cfg.decode.beam}, {device}, {precision}, engine={cfg.engine})")
    checkpoint_info = {"path": str(checkpoint), "which": "average" if averaged_from else cfg.checkpoint,
                       "update": loaded.update, "averaged_from": averaged_from}
    decode_info = {**to_plain(cfg.decode), "device": str(device), "precision": precision, "engine": cfg.engine}
    translate = sentence_translator(model, loaded.tokenizer, cfg.decode, device, precision)
    return score_split(run, cfg.split, loaded.config.data, split, translate, checkpoint_info, decode_info,
                       metrics, cfg.tokenize, cfg.lowercase, cfg.chrf_word_order, log)


def sentence_translator(model: Any, tokenizer: Any, decode_cfg: Any, device: Any, precision: str) -> Translate:
    """The best hypothesis per source sentence, decoded with `decode_cfg` (a `Translate`)."""
    import torch

    from mtrain.decode import translate_sentences

    def translate(sources: List[str]) -> List[str]:
        with torch.inference_mode():
            nbest = translate_sentences(model, tokenizer, sources, decode_cfg, device, precision)
        return [candidates[0].text if candidates else "" for candidates in nbest]

    return translate


def score_split(run: RunDir, split_key: str, data_cfg: Any, split: SplitText, translate: Translate,
                checkpoint_info: Dict[str, Any], decode_info: Dict[str, Any], metrics: Sequence[str],
                tokenize: str = "13a", lowercase: bool = False, chrf_word_order: int = 0,
                log: Callable[[str], None] = print) -> Dict[str, Any]:
    """Translate and score one split of a run, write `eval/<split>.{hyp,json,md}`; the report.

    `mtrain eval run=...` and the test scoring at the end of `mtrain fit` both come here.
    """
    name = f"data.splits.{split_key}={data_cfg.splits[split_key]}"
    scored = translate_and_score(translate, split.sources, split.references, name, metrics, tokenize,
                                 lowercase, chrf_word_order)
    report = {
        "run": str(run.path.resolve()),
        "split": split_key,
        "split_name": str(data_cfg.splits[split_key]),
        "language_pair": f"{data_cfg.src}-{data_cfg.tgt}",
        "checkpoint": checkpoint_info,
        "decode": decode_info,
        "data": split.files,
        "sentences": len(scored.hypotheses),
        "skipped_pairs": split.skipped,
        "decode_time_s": round(scored.seconds, 3),
        "sentences_per_s": round(scored.sentences_per_second, 2),
        "metrics": scored.scores,
        "scoring": {"tokenize": tokenize, "lowercase": lowercase, "chrf_word_order": chrf_word_order},
        "mtrain_version": __version__,
        "created": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    }
    replaced = replaced_report_note(run.eval_file(split_key, "json"), report)
    paths = write_report(run.eval_dir, split_key, report, scored.hypotheses)
    if replaced:
        log(replaced)
    log(metrics_table(scored.scores).to_text())
    log(f"{len(scored.hypotheses)} sentences in {scored.seconds:.1f}s ({report['sentences_per_s']:.1f} "
        f"sentences/s); report: {paths['json']}, {paths['md']}")
    return report


def replaced_report_note(path: Path, report: Dict[str, Any]) -> Optional[str]:
    """What an earlier report at `path` said, when the new one scores differently (never
    replace a report silently: a poorer number must say what changed)."""
    if not path.is_file():
        return None
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
        old_bleu = float(old["metrics"]["bleu"]["score"])
        new_bleu = float(report["metrics"]["bleu"]["score"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if abs(old_bleu - new_bleu) < 0.005:
        return None
    return (f"{path}: replacing BLEU {old_bleu:.2f} ({_what_was_decoded(old)}) with {new_bleu:.2f} "
            f"({_what_was_decoded(report)}); the earlier hypotheses are replaced too")


def _what_was_decoded(report: Dict[str, Any]) -> str:
    checkpoint = report.get("checkpoint", {})
    return (f"{Path(str(checkpoint.get('path', '?'))).name} (update {checkpoint.get('update', '?')}), "
            f"beam {report.get('decode', {}).get('beam', '?')}")


def write_report(out_dir: Path, split: str, report: Dict[str, Any], hyps: Sequence[str]) -> Dict[str, Path]:
    """Write `<split>.hyp`, `<split>.json` and `<split>.md` into `out_dir` (each atomically).

    The hypothesis file's own record (path, hash) is added to `report["data"]`.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {kind: out_dir / f"{split}.{kind}" for kind in ("hyp", "json", "md")}
    atomic_write_text(paths["hyp"], "".join(line + "\n" for line in hyps))
    report["data"] = [r for r in report.get("data", []) if r.get("role") != "hypotheses"]
    report["data"].append(file_record(paths["hyp"], "hypotheses"))
    atomic_write_text(paths["json"], json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    atomic_write_text(paths["md"], render_markdown(report))
    return paths


def render_markdown(report: Dict[str, Any]) -> str:
    checkpoint = report["checkpoint"]
    lines = [f"# Evaluation of {report['run']} on {report['split']} ({report.get('split_name', '')})", "",
             metrics_table(report["metrics"]).to_markdown(), ""]
    lines += [f"    {values['text']}" for values in report["metrics"].values()] + [""]
    if checkpoint.get("averaged_from"):
        sources = ", ".join(Path(p).name for p in checkpoint["averaged_from"])
        lines.append(f"- **Checkpoint**: average of {sources} -> `{checkpoint['path']}` (update {checkpoint['update']})")
    else:
        lines.append(f"- **Checkpoint**: `{checkpoint['path']}` ({checkpoint['which']}, update {checkpoint['update']})")
    decode = report["decode"]
    settings = ", ".join(f"{key}={value}" for key, value in decode.items())
    lines += [f"- **Decoding**: {settings}",
              f"- **Sentences**: {report['sentences']}"
              + (f" ({report['skipped_pairs']} pairs skipped: not valid UTF-8)" if report.get("skipped_pairs") else ""),
              f"- **Decoding time**: {report['decode_time_s']:.2f} s ({report['sentences_per_s']:.1f} sentences/s)",
              "- **Scoring**: " + ", ".join(f"{k}={v}" for k, v in report["scoring"].items()),
              f"- **mtrain** {report['mtrain_version']}, {report['created']}", "",
              "| file | role | lines | sha256 |", "|---|---|---|---|"]
    lines += [f"| `{r['path']}` | {r['role']} | {r['lines']} | `{r['sha256']}` |" for r in report["data"]]
    return "\n".join(lines) + "\n"
