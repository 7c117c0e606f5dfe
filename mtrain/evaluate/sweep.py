"""`mtrain report SWEEP_DIR`: a Markdown table of a sweep's runs and plots of their curves.

The table is the one `mtrain eval runs=...` prints (from `compare.runs_table`); the plots
put every run's training loss, and every run's validation BLEU, on one figure each, as PNG and
SVG. When a configuration was trained with several seeds, a second table gives each arm's
spread over its seeds and its difference to the baseline's arm (arm_comparison.py), and the
plots draw each arm once: its seeds' mean and min-max band. Jobs that failed (their
`failed.json`) are counted in the heading and listed with their reasons.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mtrain.evaluate.arm_comparison import ArmComparison, arm_notes, compare_arms
from mtrain.evaluate.arms import group_arms, has_seed_replicates
from mtrain.evaluate.compare import Comparison, runs_table
from mtrain.evaluate.curves import TRAIN_LOSS, VALID_BLEU, plot_curves, read_scalars
from mtrain.evaluate.runs import differing_overrides, discover_runs, failure_notes
from mtrain.evaluate.tables import Table
from mtrain.run_summary import RunSummary

REPORT_FILE = "report.md"
LOSS_PLOT = "train_loss.png"
BLEU_PLOT = "valid_bleu.png"


@dataclass
class SweepReport:
    markdown: Path
    table: Table
    plots: list[Path] = field(default_factory=list)  # the PNGs (an SVG lies beside each)
    notes: list[str] = field(default_factory=list)
    over_seeds: ArmComparison | None = None


def write_sweep_report(
    spec: str, out_dir: Path, comparison: Comparison | None = None, log: Callable[[str], None] = print
) -> SweepReport:
    """Discover the runs of `spec`, write `report.md` and the PNG plots into `out_dir`.

    A `comparison` (from `compare.compare_runs`) adds its bootstrap columns to the table, or its
    table over seeds; without one, seeds are still grouped (spread and Welch's test, no bootstrap).
    """
    runs = comparison.runs if comparison else discover_runs(spec)
    keys = comparison.keys if comparison else differing_overrides(runs)
    table = runs_table(runs, keys, comparison)
    arms = group_arms(runs)
    grouped = has_seed_replicates(arms)
    over_seeds = comparison.over_seeds if comparison else None
    if grouped and over_seeds is None:
        over_seeds = compare_arms(arms, {run.name: "test" for run in runs}, {}, None, num_samples=0)
    curves = {run.name: read_scalars(run.path) for run in runs}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    plots, notes = [], []
    for tag, file_name, ylabel, title in (
        (TRAIN_LOSS, LOSS_PLOT, "training loss", "Training loss"),
        (VALID_BLEU, BLEU_PLOT, "validation BLEU", "Validation BLEU"),
    ):
        if grouped:
            title += f" by arm: mean over seeds, band min-max ({len(arms)} arms, {len(runs)} runs)"
        title += f" ({_short_label(spec, runs)})"
        if plot_curves(runs, curves, tag, keys, out_dir / file_name, ylabel, title, arms if grouped else None):
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
    if over_seeds:
        lines += ["## Over seeds", "", over_seeds.table().to_markdown(), ""]
        if not comparison:  # (a comparison's notes above hold these)
            lines += [f"- {note}" for note in arm_notes(over_seeds)] + [""]
    if failures:
        lines += ["## Failed jobs", ""] + [f"- {note}" for note in failures] + [""]
    for plot in plots:
        lines += [f"![{plot.stem.replace('_', ' ')}]({plot.name}) ([SVG]({plot.with_suffix('.svg').name}))", ""]
    lines += [f"- {note}" for note in notes]
    markdown = out_dir / REPORT_FILE
    markdown.write_text("\n".join(lines).rstrip() + "\n", encoding="utf-8")
    log(table.to_text())
    if over_seeds:
        log(f"\nOver seeds ({len(over_seeds.arms)} arms):\n" + over_seeds.table().to_text())
    for note in failures:
        log(note)
    log(f"report written to {markdown}" + (f" with {', '.join(p.name for p in plots)}" if plots else ""))
    return SweepReport(markdown, table, plots, notes, over_seeds)


def _short_label(spec: str, runs: Sequence[RunSummary]) -> str:
    """The sweep directory, or for a list of run directories their common parent and count; a
    long path keeps its last three parts (`multirun/DATE/TIME`), so the plot's title stays readable."""
    if "," not in spec:
        return _short_path(spec)
    parent = os.path.commonpath([str(run.path) for run in runs]) if runs else ""
    return f"{len(runs)} runs in {_short_path(parent or '.')}"


def _short_path(path: str, longest: int = 40) -> str:
    parts = Path(path).parts
    return path if len(path) <= longest or len(parts) <= 3 else "…/" + "/".join(parts[-3:])


def _common_overrides(runs: Sequence[RunSummary], differing: Sequence[str]) -> list[str]:
    if not runs:
        return []
    first: dict[str, str] = runs[0].overrides
    return [
        f"{key}={value}"
        for key, value in first.items()
        if key not in differing and all(run.overrides.get(key) == value for run in runs)
    ]
