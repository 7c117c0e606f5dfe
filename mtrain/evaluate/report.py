"""`mtrain eval run=RUN split=test`: decode a run's split, score it, and write the report.

The report (`<run>/eval/<split>.json` and `.md`, hypotheses in `.hyp`) holds what a
reviewer needs to trust the number: each metric with its sacreBLEU signature, the
checkpoint (or averaged checkpoints), the decoding settings, the data files with their
hashes, the number of sentences, and how long decoding took.
"""

from __future__ import annotations

import datetime
import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from mtrain.errors import MtrainError
from mtrain.evaluate.metrics import check_lengths, check_metric_names, read_lines, score_corpus
from mtrain.evaluate.references import SplitText, file_record, read_reference_files, read_split_text
from mtrain.evaluate.runs import run_config
from mtrain.evaluate.tables import Table

EVAL_DIR = "eval"


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
        split = read_split_text(run_config(Path(cfg.run)).data, cfg.split)
        ref_names = [record["path"] for record in split.files if "reference" in record["role"]]
    else:
        raise MtrainError("hyp=... needs references: ref=FILE (or ref=[FILE1,FILE2]), or run=RUN to use its split")
    check_lengths(len(hyps), [len(stream) for stream in split.references], f"hyp={hyp_path}", ref_names)
    scores = score_corpus(hyps, split.references, metrics, cfg.tokenize, cfg.lowercase, cfg.chrf_word_order)
    log(metrics_table(scores).to_text())
    return {"hypotheses": file_record(hyp_path, "hypotheses"), "data": split.files,
            "sentences": len(hyps), "metrics": scores}


def evaluate_run(cfg: Any, log: Callable[[str], None] = print) -> Dict[str, Any]:
    """Decode `cfg.split` of `cfg.run`, score it, write `eval/<split>.{json,md,hyp}`."""
    import torch

    from mtrain.decode import translate_sentences
    from mtrain.evaluate.average import average_to_file, default_average_path, last_checkpoints
    from mtrain.train.checkpoint import find_checkpoint, load_run
    from mtrain.decode.translator import resolve_decode_precision
    from mtrain.train.runtime import resolve_device, set_threads

    metrics = check_metric_names(cfg.metrics)
    run_dir = Path(cfg.run)
    if not run_dir.is_dir():
        raise MtrainError(f"run={run_dir}: no such run directory")
    if cfg.engine not in ("torch", "ctranslate2"):
        raise MtrainError(f"engine={cfg.engine}: choose torch or ctranslate2")
    set_threads(cfg.num_threads)
    device = resolve_device(cfg.device)
    # CTranslate2 also takes its own weight types (precision=int8); see mtrain.decode.ct2_engine.
    precision = resolve_decode_precision(cfg.precision, device) if cfg.engine == "torch" else cfg.precision

    averaged_from: Optional[List[str]] = None
    if cfg.average_last > 0:
        sources_ckpts = last_checkpoints(run_dir, cfg.average_last)
        checkpoint = average_to_file(sources_ckpts, default_average_path(run_dir, cfg.average_last))
        averaged_from = [str(path) for path in sources_ckpts]
        log(f"averaged {', '.join(p.name for p in sources_ckpts)} into {checkpoint}")
    else:
        checkpoint = find_checkpoint(run_dir, cfg.checkpoint)
    loaded = load_run(run_dir, device=device, checkpoint_path=checkpoint)
    model = loaded.model
    if cfg.engine == "ctranslate2":  # the same checkpoint, converted
        from mtrain.export.engine import convert_loaded

        model = convert_loaded(loaded, device, precision, cfg.num_threads)
        precision = model.translator.compute_type

    split = read_split_text(loaded.config.data, cfg.split)
    if cfg.ref:  # explicit references replace the split's (e.g. extra references)
        given = read_reference_files(list(cfg.ref))
        split = SplitText(split.sources, given.references, [split.files[0]] + given.files)
    check_lengths(len(split.sources), [len(stream) for stream in split.references], "source",
                  [record["path"] for record in split.files[1:]] or None)

    log(f"decoding {len(split.sources)} sentences of {cfg.split} with {checkpoint} "
        f"(beam {cfg.decode.beam}, {device}, {precision}, engine={cfg.engine})")
    start = time.perf_counter()
    with torch.inference_mode():
        nbest = translate_sentences(model, loaded.tokenizer, split.sources, cfg.decode, device, precision)
    seconds = time.perf_counter() - start
    hyps = [candidates[0].text if candidates else "" for candidates in nbest]
    output_tokens = sum(len(candidates[0].tokens) for candidates in nbest if candidates)

    scores = score_corpus(hyps, split.references, metrics, cfg.tokenize, cfg.lowercase, cfg.chrf_word_order)
    report = {
        "run": str(run_dir.resolve()),
        "split": cfg.split,
        "split_name": str(loaded.config.data.splits[cfg.split]),
        "language_pair": f"{loaded.config.data.src}-{loaded.config.data.tgt}",
        "checkpoint": {"path": str(checkpoint), "which": "average" if averaged_from else cfg.checkpoint,
                       "update": loaded.update, "averaged_from": averaged_from},
        "decode": {**_plain(cfg.decode), "device": str(device), "precision": precision, "engine": cfg.engine},
        "data": split.files,
        "sentences": len(hyps),
        "skipped_pairs": split.skipped,
        "decode_time_s": round(seconds, 3),
        "sentences_per_s": round(len(hyps) / max(seconds, 1e-9), 2),
        "target_tokens_per_s": round(output_tokens / max(seconds, 1e-9), 1),
        "metrics": scores,
        "scoring": {"tokenize": cfg.tokenize, "lowercase": cfg.lowercase, "chrf_word_order": cfg.chrf_word_order},
        "mtrain_version": _version(),
        "created": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    }
    paths = write_report(run_dir / EVAL_DIR, cfg.split, report, hyps)
    log(metrics_table(scores).to_text())
    log(f"{len(hyps)} sentences in {seconds:.1f}s ({report['sentences_per_s']:.1f} sentences/s); "
        f"report: {paths['json']}, {paths['md']}")
    return report


def write_report(out_dir: Path, split: str, report: Dict[str, Any], hyps: Sequence[str]) -> Dict[str, Path]:
    """Write `<split>.hyp`, `<split>.json` and `<split>.md` into `out_dir` (each atomically).

    The hypothesis file's own record (path, hash) is added to `report["data"]`.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {kind: out_dir / f"{split}.{kind}" for kind in ("hyp", "json", "md")}
    _write_atomic(paths["hyp"], "".join(line + "\n" for line in hyps))
    report["data"] = [r for r in report.get("data", []) if r.get("role") != "hypotheses"]
    report["data"].append(file_record(paths["hyp"], "hypotheses"))
    _write_atomic(paths["json"], json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    _write_atomic(paths["md"], render_markdown(report))
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
              f"- **Decoding time**: {report['decode_time_s']:.2f} s ({report['sentences_per_s']:.1f} sentences/s, "
              f"{report['target_tokens_per_s']:.0f} target tokens/s)",
              "- **Scoring**: " + ", ".join(f"{k}={v}" for k, v in report["scoring"].items()),
              f"- **mtrain** {report['mtrain_version']}, {report['created']}", "",
              "| file | role | lines | sha256 |", "|---|---|---|---|"]
    lines += [f"| `{r['path']}` | {r['role']} | {r['lines']} | `{r['sha256']}` |" for r in report["data"]]
    return "\n".join(lines) + "\n"


def _plain(node: Any) -> Dict[str, Any]:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(node)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _version() -> str:
    from mtrain import __version__

    return __version__
