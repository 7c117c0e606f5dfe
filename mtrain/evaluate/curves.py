"""Training curves: scalars read back from a run's TensorBoard events, plotted per sweep.

The trainer logs `train/loss` and `valid/bleu` to `<run>/tb/` with the update number as
step. A resumed run appends a new event file; the later value wins for a repeated step.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from mtrain.errors import MtrainError
from mtrain.evaluate.runs import RunSummary, describe
from mtrain.rundir import RunDir

MIN_AXIS_SPAN = 0.5  # loss or BLEU points: a smaller y range is noise, not a trend

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


def plot_curves(
    runs: Sequence[RunSummary],
    curves: dict[str, dict[str, Curve]],  # run name -> tag -> curve
    tag: str,
    keys: Sequence[str],
    path: Path,
    ylabel: str,
    title: str,
) -> bool:
    """All runs' curves of one tag on one figure, saved as PNG; False when no run has it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    figure, axes = plt.subplots(figsize=(8, 5))
    plotted = 0
    all_values: list[float] = []
    healthy_values: list[float] = []  # values of runs that did not diverge
    # Line styles cycle too: runs that train alike (same seed, a small change) overlap, and a
    # dashed line over a solid one keeps both visible.
    styles = ["-", "--", ":", "-."]
    for run in runs:
        curve = curves.get(run.name, {}).get(tag, [])
        if not curve:
            continue
        steps = [step for step, _ in curve]
        values = [value for _, value in curve]
        finite = [v for v in values if math.isfinite(v)]
        all_values += finite
        if not run.diverged:
            healthy_values += finite
        difference = describe(run, keys)
        label = run.name + ("" if difference == "-" else f": {difference}") + (" (diverged)" if run.diverged else "")
        axes.plot(
            steps,
            values,
            styles[plotted % len(styles)],
            marker="o" if len(curve) < 20 else None,
            markersize=3,
            label=label,
        )
        plotted += 1
    if not plotted:
        plt.close(figure)
        return False
    if tag == TRAIN_LOSS and healthy_values and max(all_values) > 2 * max(healthy_values):
        # A diverged run's loss explodes; keep the scale of the runs that trained.
        low, high = min(all_values), max(healthy_values)
        axes.set_ylim(low - 0.05 * (high - low), high + 0.2 * (high - low))
    elif all_values:
        axes.set_ylim(*readable_limits(all_values))
    axes.ticklabel_format(axis="y", useOffset=False, style="plain")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))  # updates are whole numbers
    axes.set_xlabel("update")
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize="small")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return True
