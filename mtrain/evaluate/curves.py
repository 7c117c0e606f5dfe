"""Training curves: scalars read back from a run's TensorBoard events, plotted per sweep.

The trainer logs `train/loss` and `valid/bleu` to `<run>/tb/` with the update number as
step. A resumed run appends a new event file; the later value wins for a repeated step.
Runs of one arm (the same configuration, other seeds) are drawn as one: their mean, with a
band from the lowest to the highest seed, in one colour per arm.
"""

from __future__ import annotations

import itertools
import logging
import math
import textwrap
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mtrain.errors import MtrainError
from mtrain.evaluate.arms import Arm
from mtrain.evaluate.runs import describe
from mtrain.run_summary import RunSummary
from mtrain.rundir import RunDir

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

MIN_AXIS_SPAN = 0.5  # loss or BLEU points: a smaller y range is noise, not a trend

# The plots' layout on an 8-inch-wide figure: the axes' height, characters per line of the
# legend (at its small font) and of the title, and the height of a legend line and of the
# space between entries; tick labels closer than TICK_GAP_PIXELS count as touching.
AXES_INCHES = 4.0
LEGEND_WIDTH = 100
TITLE_WIDTH = 70
LEGEND_LINE_INCHES = 0.17
LEGEND_ENTRY_INCHES = 0.07
TICK_GAP_PIXELS = 4

TRAIN_LOSS = "train/loss"
VALID_BLEU = "valid/bleu"

Curve = list[tuple[int, float]]  # (update, value), sorted by update


def _accumulators(run_dir: Path) -> Iterator[Any]:  # EventAccumulator (tensorboard is untyped)
    """One loaded EventAccumulator per directory of event files under `<run>/tb/`."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    # The event reader logs every file it opens at INFO; that is noise in a report.
    logging.getLogger("tensorboard").setLevel(logging.WARNING)
    tb_dir = RunDir(run_dir).tensorboard_dir
    if not tb_dir.is_dir():
        return
    # Event files may sit in tb/ itself or one level below (one writer per subdirectory).
    for event_dir in sorted({path.parent for path in tb_dir.rglob("events.out.tfevents.*")}):
        accumulator = EventAccumulator(str(event_dir), size_guidance={"scalars": 0})
        try:
            accumulator.Reload()
        except Exception as error:  # a truncated event file from a killed run
            raise MtrainError(f"{event_dir}: unreadable TensorBoard events ({error})") from error
        yield accumulator


def scalar_tags(run_dir: Path) -> list[str]:
    """Every scalar tag a run logged (sorted), e.g. the `instruments/...` of an ablation run."""
    return sorted({tag for acc in _accumulators(run_dir) for tag in acc.Tags().get("scalars", [])})


def read_scalars(run_dir: Path, tags: Sequence[str] = (TRAIN_LOSS, VALID_BLEU)) -> dict[str, Curve]:
    """The requested scalar tags of a run ({} entries for tags it never logged)."""
    curves: dict[str, Curve] = {tag: [] for tag in tags}
    for accumulator in _accumulators(run_dir):
        available = set(accumulator.Tags().get("scalars", []))
        for tag in tags:
            if tag in available:
                by_step = dict(curves[tag])
                by_step.update((event.step, float(event.value)) for event in accumulator.Scalars(tag))
                curves[tag] = sorted(by_step.items())
    return curves


def readable_limits(values: Sequence[float]) -> tuple[float, float]:
    """Y-axis limits around `values` with a readable minimum span: a few near-equal points (a
    short run, one validation) would otherwise get an axis spanning 0.00001."""
    low, high = min(values), max(values)
    span = max(high - low, 0.05 * abs(high + low) / 2, MIN_AXIS_SPAN)
    middle = (low + high) / 2
    return middle - 0.6 * span, middle + 0.6 * span


def quiet_matplotlib() -> None:
    """matplotlib logs "generated new fontManager" at INFO on its first import on a machine (no
    font cache yet); eval and report log INFO to stdout, so that line landed inside their table."""
    logging.getLogger("matplotlib").setLevel(logging.WARNING)


def plot_curves(
    runs: Sequence[RunSummary],
    curves: dict[str, dict[str, Curve]],  # run name -> tag -> curve
    tag: str,
    keys: Sequence[str],
    path: Path,
    ylabel: str,
    title: str,
    arms: Sequence[Arm] | None = None,
) -> bool:
    """All runs' curves of one tag on one figure (with `arms`: one mean line and band per arm),
    saved as PNG at `path` and as SVG beside it; False when no run has the tag."""
    quiet_matplotlib()
    import matplotlib.pyplot as plt

    figure = curves_figure(runs, curves, tag, keys, ylabel, title, arms)
    if figure is None:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    # A vector copy for papers and slides; no date in it, so a rerun writes the same file.
    figure.savefig(path.with_suffix(".svg"), metadata={"Date": None})
    plt.close(figure)
    return True


@dataclass
class _Series:
    """One line of a plot: a run's curve, or an arm's mean over its seeds with its min-max band."""

    steps: list[int]
    values: list[float]
    label: str
    diverged: bool
    low: list[float] | None = None
    high: list[float] | None = None


def _run_series(
    runs: Sequence[RunSummary], curves: dict[str, dict[str, Curve]], tag: str, keys: Sequence[str]
) -> Iterator[_Series]:
    for run in runs:
        curve = curves.get(run.name, {}).get(tag, [])
        if not curve:
            continue
        difference = describe(run, keys)
        label = run.name + ("" if difference == "-" else f": {difference}") + (" (diverged)" if run.diverged else "")
        yield _Series([step for step, _ in curve], [value for _, value in curve], label, bool(run.diverged))


def _arm_series(arms: Sequence[Arm], curves: dict[str, dict[str, Curve]], tag: str) -> Iterator[_Series]:
    """Per arm, at the updates every seed logged (all updates any logged, if none in common), the
    seeds' mean and their lowest and highest value."""
    for arm in arms:
        seeds = [dict(curves.get(run.name, {}).get(tag, [])) for run in arm.runs]
        seeds = [curve for curve in seeds if curve]
        if not seeds:
            continue
        common = set.intersection(*(set(curve) for curve in seeds))
        steps = sorted(common or set().union(*(set(curve) for curve in seeds)))
        at_step = [[curve[step] for curve in seeds if step in curve] for step in steps]
        diverged = sum(bool(run.diverged) for run in arm.runs)
        label = arm.name + ("" if arm.label == "-" else f": {arm.label}")
        if len(arm.runs) > 1:
            label += f" (mean of {len(seeds)} seeds, band min-max"
            label += f"; {diverged} diverged)" if diverged else ")"
        elif diverged:
            label += " (diverged)"
        band = len(seeds) > 1
        yield _Series(
            steps,
            [sum(values) / len(values) for values in at_step],
            label,
            diverged > 0,
            [min(values) for values in at_step] if band else None,
            [max(values) for values in at_step] if band else None,
        )


def curves_figure(
    runs: Sequence[RunSummary],
    curves: dict[str, dict[str, Curve]],
    tag: str,
    keys: Sequence[str],
    ylabel: str,
    title: str,
    arms: Sequence[Arm] | None = None,
) -> Figure | None:
    """The figure `plot_curves` saves (None when no run has `tag`): the curves on one axes (with
    `arms`, one colour per arm: its seeds' mean and a min-max band), the legend below it, outside,
    its labels wrapped, and the figure as tall as the legend needs, so a label of any length and any
    number of runs fit without covering a curve or being cut; the update ticks thinned (then
    slanted) until no two labels touch."""
    quiet_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = list(_arm_series(arms, curves, tag) if arms is not None else _run_series(runs, curves, tag, keys))
    if not series:
        return None
    all_values: list[float] = []
    healthy_values: list[float] = []  # values of runs (arms) that did not diverge
    for line in series:
        finite = [v for v in line.values + (line.low or []) + (line.high or []) if math.isfinite(v)]
        all_values += finite
        if not line.diverged:
            healthy_values += finite

    columns, width = (
        (2, LEGEND_WIDTH // 2) if max(len(line.label) for line in series) <= LEGEND_WIDTH // 2 else (1, LEGEND_WIDTH)
    )
    labels = [textwrap.fill(line.label, width, break_on_hyphens=False) for line in series]
    title = textwrap.fill(title, TITLE_WIDTH, break_on_hyphens=False)
    # Legend rows fill each column top-down: the tallest column sets the legend's height.
    per_column = math.ceil(len(labels) / columns)
    legend_lines = max(
        sum(label.count("\n") + 1 for label in labels[start : start + per_column])
        for start in range(0, len(labels), per_column)
    )
    legend_height = LEGEND_LINE_INCHES * legend_lines + LEGEND_ENTRY_INCHES * per_column + 0.3
    title_height = 0.25 * (title.count("\n") + 1)
    figure = plt.figure(figsize=(8, AXES_INCHES + title_height + legend_height), layout="constrained")
    axes = figure.add_subplot()
    # Line styles cycle too: runs that train alike (same seed, a small change) overlap, and a
    # dashed line over a solid one keeps both visible.
    styles = ["-", "--", ":", "-."]
    for index, (line, label) in enumerate(zip(series, labels, strict=True)):
        (drawn,) = axes.plot(
            line.steps,
            line.values,
            styles[index % len(styles)],
            marker="o" if len(line.steps) < 20 else None,
            markersize=3,
            label=label,
        )
        if line.low is not None and line.high is not None:
            axes.fill_between(line.steps, line.low, line.high, color=drawn.get_color(), alpha=0.2, linewidth=0)
    if tag == TRAIN_LOSS and healthy_values and max(all_values) > 2 * max(healthy_values):
        # A diverged run's loss explodes; keep the scale of the runs that trained.
        low, high = min(all_values), max(healthy_values)
        axes.set_ylim(low - 0.05 * (high - low), high + 0.2 * (high - low))
    elif all_values:
        axes.set_ylim(*readable_limits(all_values))
    axes.ticklabel_format(axis="y", useOffset=False, style="plain")
    axes.set_xlabel("update")
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    figure.legend(loc="outside lower center", ncols=columns, fontsize="small", frameon=False)
    # The estimate above, corrected once drawn: the axes keep their height whatever the legend takes.
    figure.canvas.draw()
    axes_height = axes.get_window_extent().height / figure.dpi
    figure.set_size_inches(8, figure.get_size_inches()[1] + AXES_INCHES - axes_height)
    _fit_update_ticks(figure, axes)
    return figure


def update_label(update: float, _position: object = None) -> str:
    """An update number as a tick label: 900, 15k, 2.5M (12,000-wide labels would run together)."""
    if abs(update) >= 1_000_000:
        return f"{update / 1_000_000:g}M"
    if abs(update) >= 10_000:
        return f"{update / 1000:g}k"
    return f"{update:g}"


def _fit_update_ticks(figure: Figure, axes: Axes) -> None:
    """Whole-number update ticks, fewer of them (then slanted) until no two labels overlap."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    axes.xaxis.set_major_formatter(FuncFormatter(update_label))
    for bins in ("auto", 6, 4, 3):
        axes.xaxis.set_major_locator(MaxNLocator(nbins=bins, integer=True))  # updates are whole numbers
        if not _tick_labels_overlap(figure, axes):
            return
    for label in axes.get_xticklabels():
        label.set_rotation(30)
        label.set_horizontalalignment("right")


def _tick_labels_overlap(figure: Figure, axes: Axes) -> bool:
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()  # type: ignore[attr-defined]
    boxes = sorted(
        (label.get_window_extent(renderer) for label in axes.get_xticklabels() if label.get_text()),
        key=lambda box: box.x0,
    )
    return any(left.x1 + TICK_GAP_PIXELS > right.x0 for left, right in itertools.pairwise(boxes))
