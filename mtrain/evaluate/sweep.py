"""`mtrain report SWEEP_DIR`: a Markdown table of a sweep's runs and plots of their curves.

The table is the one `mtrain eval runs=...` prints (from `compare.runs_table`); the plots
put every run's training loss, and every run's validation BLEU, on one figure each. Jobs that
failed (their `failed.json`) are counted in the heading and listed with their reasons.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mtrain.evaluate.compare import Comparison, runs_table
from mtrain.evaluate.curves import TRAIN_LOSS, VALID_BLEU, plot_curves, read_scalars
from mtrain.evaluate.runs import RunSummary, differing_overrides, discover_runs, failure_notes
from mtrain.evaluate.tables import Table

REPORT_FILE = "report.md"
LOSS_PLOT = "train_loss.png"
BLEU_PLOT = "valid_bleu.png"


@dataclass
class SweepReport:
    markdown: Path
    table: Table
    plots: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def write_sweep_report(
    spec: str, out_dir: Path, comparison: Comparison | None = None, log: Callable[[str], None] = print
) -> SweepReport:
    """Discover the runs of `spec`, write `report.md` and the PNG plots into `out_dir`.

    A `comparison` (from `compare.compare_runs`) adds its bootstrap columns to the table.
    """
    runs = comparison.runs if comparison else discover_runs(spec)
    keys = comparison.keys if comparison else differing_overrides(runs)
    table = runs_table(runs, keys, comparison)
    curves = {run.name: read_scalars(run.path) for run in runs}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    plots, notes = [], []
    for tag, file_name, ylabel, title in (
        (TRAIN_LOSS, LOSS_PLOT, "training loss", "Training loss"),
        (VALID_BLEU, BLEU_PLOT, "validation BLEU", "Validation BLEU"),
    ):
        if plot_curves(runs, curves, tag, keys, out_dir / file_name, ylabel, f"{title} ({_short_label(spec, runs)})"):
            plots.append(out_dir / file_name)
        else:
            notes.append(f"no run logged `{tag}` to TensorBoard (<run>/tb/), so there is no {file_name}")
    for run in runs:
        missing = [tag for tag, curve in curves[run.name].items() if not curve]
        if missing and plots and not run.failure:  # a failed job's reason says it all
            notes.append(f"run {run.name}: no {', '.join(missing)} events in {run.path / 'tb'}")
        if not run.metrics and not run.failure:
            notes.append(f"run {run.name}: no metrics.json (still running, or crashed before the end)")
    failures = failure_notes(runs)

    common = _common_overrides(runs, keys)
    heading = f"{len(runs)} run{'' if len(runs) == 1 else 's'}" + (
        f", {len(failures)} of them failed (see below)." if failures else "."
    )
    lines = [f"# Sweep report: {spec}", "", heading]
    if common:
        lines += ["", "Overrides shared by every run: " + " ".join(f"`{item}`" for item in common)]
    lines += ["", table.to_markdown(), ""]
    if comparison:
        from mtrain.evaluate.compare import comparison_notes

        lines += [f"- {note}" for note in comparison_notes(comparison)] + [""]
    if failures:
        lines += ["## Failed jobs", ""] + [f"- {note}" for note in failures] + [""]
    for plot in plots:
        lines += [f"![{plot.stem.replace('_', ' ')}]({plot.name})", ""]
    lines += [f"- {note}" for note in notes]
    markdown = out_dir / REPORT_FILE
    markdown.write_text("\n".join(lines).rstrip() + "\n", encoding="utf-8")
    log(table.to_text())
    for note in failures:
        log(note)
    log(f"report written to {markdown}" + (f" with {', '.join(p.name for p in plots)}" if plots else ""))
    return SweepReport(markdown, table, plots, notes)


def _short_label(spec: str, runs: Sequence[RunSummary]) -> str:
    """The sweep directory, or for a list of run directories their common parent and count."""
    if "," not in spec:
        return spec
    parent = os.path.commonpath([str(run.path) for run in runs]) if runs else ""
    return f"{len(runs)} runs in {parent or '.'}"


def _common_overrides(runs: Sequence[RunSummary], differing: Sequence[str]) -> list[str]:
    if not runs:
        return []
    first: dict[str, str] = runs[0].overrides
    return [
        f"{key}={value}"
        for key, value in first.items()
        if key not in differing and all(run.overrides.get(key) == value for run in runs)
    ]
