"""The report of a scored split: `<run>/eval/<split>.json` and `.md`, hypotheses in `.hyp`,
and with `per_sentence` the sentence scores in `.sentences.tsv` (mtrain.evaluate.sentences).

A report holds what a reviewer needs to trust the number: each metric with its sacreBLEU
signature, the checkpoint (or averaged checkpoints; an ensemble's members), the decoding settings, the data files
with their hashes, the number of sentences, and how long decoding took. This module only
builds and writes reports; `mtrain.evaluate.scoring.score_split` scores a split and comes
here, for `mtrain eval run=...` (mtrain.cli.evaluate) and the test split at the end of `mtrain fit`.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mtrain import __version__
from mtrain.config import DataConfig
from mtrain.evaluate.references import SplitText, file_record
from mtrain.evaluate.scored import Scored
from mtrain.evaluate.sentences import SentenceScore, sentences_path, write_sentences_tsv
from mtrain.evaluate.tables import Table, markdown_text
from mtrain.evaluate.terminology import terms_table
from mtrain.rundir import RunDir, atomic_write_text
from mtrain.wording import counted

# sacreBLEU's defaults, as `mtrain eval` and fit's test decode score: a report scored so is
# `<split>.json`; one scored otherwise names what differs (`scored_name`).
DEFAULT_TOKENIZE = "13a"


def scored_name(name: str, tokenize: str = DEFAULT_TOKENIZE, lowercase: bool = False, chrf_word_order: int = 0) -> str:
    """The name of a report (`<name>.json|md|hyp`) scored with these settings: `name` with
    sacreBLEU's defaults, else `name` and what differs, `test.lc` (lowercase=true),
    `test.tok-intl` (tokenize=intl), `test.chrf++` (chrf_word_order=2; sacreBLEU's chrF2++),
    `test.lc.tok-intl`...: a report scored otherwise never replaces the default one, which
    `mtrain report` and `mtrain eval runs=` read (and metrics.json's test score matches)."""
    parts = [name]
    if lowercase:
        parts.append("lc")
    if str(tokenize) != DEFAULT_TOKENIZE:
        parts.append(f"tok-{tokenize}")
    if chrf_word_order:
        parts.append("chrf" + "+" * int(chrf_word_order))
    return ".".join(parts)


def metrics_table(scores: dict[str, dict[str, Any]]) -> Table:
    table = Table(["metric", "score", "signature"])
    for values in scores.values():
        table.add(values["name"], float(values["score"]), values["signature"])
    return table


def split_report(
    run: RunDir,
    split_key: str,
    data_cfg: DataConfig,
    split: SplitText,
    scored: Scored,
    checkpoint_info: dict[str, Any],
    decode_info: dict[str, Any],
    tokenize: str = "13a",
    lowercase: bool = False,
    chrf_word_order: int = 0,
) -> dict[str, Any]:
    """The report of one scored split of a run: what was decoded, with what, and the scores."""
    return {
        "run": str(run.path.resolve()),
        "split": split_key,
        "split_name": str(getattr(data_cfg.splits, split_key)),
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


def save_split_report(
    run: RunDir,
    report: dict[str, Any],
    hypotheses: Sequence[str],
    log: Callable[[str], None] = print,
    out_dir: Path | None = None,
    sentences: Sequence[SentenceScore] | None = None,
    name: str | None = None,
) -> dict[str, Path]:
    """Write `report` and its hypotheses into the run's `eval/<split>.{hyp,json,md}` (or into
    `out_dir`), and `sentences` into `<split>.sentences.tsv`; log the scores, and what an
    earlier report there said when it scored differently. `name` replaces `<split>` (a
    multilingual run's direction: `test.de-en`)."""
    split_key = name or report["split"]
    out_dir = Path(out_dir) if out_dir is not None else run.eval_dir
    replaced = replaced_report_note(report_paths(out_dir, split_key)["json"], report)
    paths = write_report(out_dir, split_key, report, hypotheses, sentences)
    if replaced:
        log(replaced)
    log(metrics_table(report["metrics"]).to_text())
    if report.get("terms"):
        log(terms_table(report["terms"]).to_text())
    log(
        f"{counted(report['sentences'], 'sentence')} in {report['decode_time_s']:.1f}s ({report['sentences_per_s']:.1f} "
        f"sentences/s); report: {paths['json']}, {paths['md']}"
        + (f"; sentence scores: {paths['sentences']}" if "sentences" in paths else "")
    )
    return paths


def replaced_report_note(path: Path, report: dict[str, Any]) -> str | None:
    """What an earlier report at `path` said, when the new one scores differently in any metric
    both hold (never replace a report silently: a poorer number must say what changed)."""
    if not path.is_file():
        return None
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
        scores = {
            values["name"]: (float(old["metrics"][metric]["score"]), float(values["score"]))
            for metric, values in report["metrics"].items()
            if metric in old.get("metrics", {})
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    changed = {name: pair for name, pair in scores.items() if abs(pair[0] - pair[1]) >= 0.005}
    if not changed:
        return None
    before = ", ".join(f"{name} {old_score:.2f}" for name, (old_score, _) in changed.items())
    after = ", ".join(f"{new_score:.2f}" for _, new_score in changed.values())
    return (
        f"{path}: replacing {before} ({_what_was_decoded(old)}) with {after} "
        f"({_what_was_decoded(report)}); the earlier hypotheses are replaced too"
    )


def _what_was_decoded(report: dict[str, Any]) -> str:
    checkpoint = report.get("checkpoint", {})
    members = len(checkpoint.get("ensemble") or [])
    return (
        f"{Path(str(checkpoint.get('path', '?'))).name} (update {checkpoint.get('update', '?')}"
        + (f", in an ensemble of {members}" if members else "")
        + f"), beam {report.get('decode', {}).get('beam', '?')}"
    )


def report_paths(out_dir: Path, split: str) -> dict[str, Path]:
    """`<split>.hyp`, `.json` and `.md` in `out_dir` (a run's `eval/`, or eval's `out=`)."""
    return {kind: Path(out_dir) / f"{split}.{kind}" for kind in ("hyp", "json", "md")}


def write_report(
    out_dir: Path,
    split: str,
    report: dict[str, Any],
    hyps: Sequence[str],
    sentences: Sequence[SentenceScore] | None = None,
) -> dict[str, Path]:
    """Write `<split>.hyp`, `<split>.json` and `<split>.md` into `out_dir` (each atomically),
    and `<split>.sentences.tsv` when `sentences` are given.

    The hypothesis file's own record (path, hash) is added to `report["data"]`. Without
    `sentences`, an earlier TSV of the split is removed: it scored hypotheses replaced now.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = report_paths(out_dir, split)
    atomic_write_text(paths["hyp"], "".join(line + "\n" for line in hyps))
    tsv = sentences_path(out_dir, split)
    if sentences is not None:
        write_sentences_tsv(tsv, sentences)
        paths["sentences"] = tsv
    else:
        tsv.unlink(missing_ok=True)
    report["data"] = [r for r in report.get("data", []) if r.get("role") != "hypotheses"]
    report["data"].append(file_record(paths["hyp"], "hypotheses"))
    atomic_write_text(paths["json"], json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    atomic_write_text(paths["md"], render_markdown(report))
    return paths


def render_markdown(report: dict[str, Any]) -> str:
    checkpoint = report["checkpoint"]
    lines = [
        f"# Evaluation of {report['run']} on {report['split']} ({report.get('split_name', '')}, "
        f"{report.get('language_pair', '')})",
        "",
        metrics_table(report["metrics"]).to_markdown(),
        "",
    ]
    lines += [f"    {values['text']}" for values in report["metrics"].values()] + [""]
    if report.get("terms"):
        terms = report["terms"]
        case = ", source terms matched ignoring case" if terms.get("ignore_case") else ""
        lines += [
            f"Terminology with the glossary `{terms['glossary']}`{case} (WMT 2021 terminology metrics, "
            "mtrain/evaluate/terminology.py):",
            "",
            terms_table(terms).to_markdown(),
            "",
        ]
    if checkpoint.get("averaged_from"):
        sources = ", ".join(Path(p).name for p in checkpoint["averaged_from"])
        lines.append(
            f"- **Checkpoint**: average of {sources} -> `{checkpoint['path']}` (update {checkpoint['update']})"
        )
    elif checkpoint.get("export"):
        lines.append(
            f"- **Checkpoint**: `{checkpoint['path']}` (update {checkpoint['update']}), as exported to "
            f"`{checkpoint['export']}`"
        )
    else:
        lines.append(f"- **Checkpoint**: `{checkpoint['path']}` ({checkpoint['which']}, update {checkpoint['update']})")
    if checkpoint.get("ensemble"):
        members = ", ".join(f"`{member['path']}` (update {member['update']})" for member in checkpoint["ensemble"])
        lines.append(f"- **Ensemble** of {len(checkpoint['ensemble'])} (mean of their log-probabilities): {members}")
    decode = report["decode"]
    settings = ", ".join(f"{key}={value}" for key, value in decode.items())
    lines += [
        f"- **Decoding**: {settings}",
        f"- **Sentences**: {report['sentences']}"
        + (f" ({report['skipped_pairs']} pairs skipped: not valid UTF-8)" if report.get("skipped_pairs") else ""),
        f"- **Decoding time**: {report['decode_time_s']:.2f} s ({report['sentences_per_s']:.1f} sentences/s)",
        "- **Scoring**: " + ", ".join(f"{k}={v}" for k, v in report["scoring"].items()),
        f"- **mtrain** {report['mtrain_version']}, {report['created']}",
        "",
        "| file | role | lines | sha256 |",
        "|---|---|---|---|",
    ]
    lines += [f"| `{r['path']}` | {r['role']} | {r['lines']} | `{r['sha256']}` |" for r in report["data"]]
    if report.get("per_sentence"):
        lines += [""] + worst_lines_markdown(report["per_sentence"])
    return "\n".join(lines) + "\n"


def worst_lines_markdown(per_sentence: dict[str, Any]) -> list[str]:
    """The report's section on the lines of lowest sentence-BLEU (their text Markdown-escaped)."""
    worst = per_sentence["worst_lines"]
    lines = [f"- **Sentence scores** (BLEU, chrF, model score per line): `{per_sentence['path']}`"]
    if not worst:  # worst_lines=0
        return lines
    lines += ["", f"## The {len(worst)} lines of lowest sentence-BLEU", ""]
    streams = len(worst[0]["references"])
    table = Table(
        ["line", "BLEU", "chrF", "model score", "source", "hypothesis"]
        + (["reference"] if streams == 1 else [f"reference {k + 1}" for k in range(streams)])
    )
    for row in worst:
        table.add(
            row["line"],
            row["bleu"],
            row["chrf"],
            row["model_score"],
            *(markdown_text(text) for text in (row["source"], row["hypothesis"], *row["references"])),
        )
    return lines + [table.to_markdown()]
