"""Comparing arms over seeds: per arm the mean, spread and t interval of its seeds' scores, and
per arm against the baseline's arm the difference with two tests: a paired bootstrap over
sentences and seeds (arm_bootstrap) and Welch's t-test over the seeds' scores (spread).

`compare.compare_runs` comes here when some configuration was trained with several seeds:
those runs are one arm, and are never tested against each other as if the seed were the effect.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mtrain.evaluate.arm_bootstrap import ArmDifference, arm_bootstrap, bootstrap_seed
from mtrain.evaluate.arms import Arm
from mtrain.evaluate.metrics import check_lengths, read_lines
from mtrain.evaluate.spread import Spread, WelchTest, spread, welch_test
from mtrain.evaluate.tables import Table

_DISPLAY = {"bleu": "BLEU", "chrf": "chrF", "ter": "TER"}


@dataclass
class ArmComparison:
    arms: list[Arm]  # the baseline's arm first
    metrics: list[str]
    split: str = "test"
    # arm name -> metric -> the spread of its seeds' recorded scores (None: no seed has one)
    spreads: dict[str, dict[str, Spread | None]] = field(default_factory=dict)
    welch: dict[str, dict[str, WelchTest | None]] = field(default_factory=dict)
    bootstrap: dict[str, dict[str, ArmDifference]] = field(default_factory=dict)  # arms with hypotheses
    num_samples: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def baseline(self) -> Arm:
        return self.arms[0]

    def table(self) -> Table:
        return arms_table(self)


def seed_scores(arm: Arm, reports: dict[str, str], metric: str) -> list[float]:
    """The recorded scores of an arm's seeds on one metric (seeds without one are left out)."""
    scores = [run.score(reports[run.name], metric) for run in arm.runs if run.name in reports]
    return [score for score in scores if score is not None]


def compare_arms(
    arms: Sequence[Arm],
    reports: dict[str, str],  # run name -> the report (eval/<name>.json|hyp) of the split compared
    hyp_paths: dict[str, Path],  # run name -> its hypotheses, for the runs that have them
    refs: Sequence[Sequence[str]] | None,
    split: str = "test",
    metrics: Sequence[str] = ("bleu", "chrf"),
    num_samples: int = 1000,
    tokenize: str = "13a",
    lowercase: bool = False,
    chrf_word_order: int = 0,
    refs_note: str | None = None,  # why there are no references, when there are none
) -> ArmComparison:
    """Spread, Welch and (with references and `num_samples`) the arm bootstrap; arms[0] is the baseline."""
    comparison = ArmComparison(arms=list(arms), metrics=list(metrics), split=split, num_samples=num_samples)
    baseline = comparison.baseline
    for arm in arms:
        comparison.spreads[arm.name] = {}
        comparison.welch[arm.name] = {}
        for metric in metrics:
            scores = seed_scores(arm, reports, metric)
            comparison.spreads[arm.name][metric] = spread(scores) if scores else None
            comparison.welch[arm.name][metric] = (
                None if arm is baseline else welch_test(scores, seed_scores(baseline, reports, metric))
            )

    with_hyps = []
    for arm in arms:
        present = [run for run in arm.runs if run.name in hyp_paths]
        if not present:
            comparison.notes.append(f"arm {arm.name}: left out of the bootstrap (no {split} hypotheses)")
            continue
        if len(present) < len(arm.runs):
            comparison.notes.append(
                f"arm {arm.name}: {len(present)} of its {len(arm.runs)} seeds have {split} hypotheses; "
                "the bootstrap draws from those"
            )
        with_hyps.append((arm, present))
    if not num_samples:
        return comparison
    if len(with_hyps) < 2 or with_hyps[0][0] is not baseline:
        comparison.notes.append(
            f"no bootstrap over sentences and seeds: the baseline's arm and another need {split} hypotheses"
        )
        return comparison
    if refs is None:
        comparison.notes.append(f"no bootstrap over sentences and seeds: {refs_note or 'no references'}")
        return comparison
    comparison.bootstrap = arm_bootstrap(
        [(arm.name, [_hypotheses(hyp_paths[run.name], refs) for run in present]) for arm, present in with_hyps],
        refs,
        metrics,
        num_samples,
        tokenize,
        lowercase,
        chrf_word_order,
    )
    single = [arm.name for arm, present in with_hyps if len(present) == 1]
    if single:
        comparison.notes.append(
            f"arm{'s' if len(single) > 1 else ''} {', '.join(single)}: one seed, so no seed variance of "
            "its own enters the bootstrap; train more seeds to count it"
        )
    return comparison


def _hypotheses(path: Path, refs: Sequence[Sequence[str]]) -> list[str]:
    hyps = read_lines(path, "hypotheses")
    check_lengths(len(hyps), [len(stream) for stream in refs], str(path))
    return hyps


def arms_table(comparison: ArmComparison) -> Table:
    """One row per arm: its seeds, each metric's mean ± sd [95% t interval], and against the
    baseline's arm the difference with its bootstrap interval, the bootstrap's p and Welch's p."""
    headers = ["arm", "differs", "seeds"]
    for metric in comparison.metrics:
        shown = _DISPLAY.get(metric, metric)
        headers += [
            f"{shown} mean ± sd [95% CI]",
            f"Δ {shown} [95% CI]",
            f"p ({shown}, bootstrap)",
            f"p ({shown}, Welch)",
        ]
    table = Table(headers)
    for arm in comparison.arms:
        name = arm.name + (" (baseline)" if arm is comparison.baseline else "")
        seeds = ", ".join("?" if seed is None else str(seed) for seed in arm.seeds)
        cells: list[object] = [name, arm.label, seeds]
        for metric in comparison.metrics:
            cells += _metric_cells(comparison, arm, metric)
        table.add(*cells)
    return table


def _metric_cells(comparison: ArmComparison, arm: Arm, metric: str) -> list[str]:
    seeds = comparison.spreads[arm.name][metric]
    mean_cell = "-" if seeds is None else _spread_cell(seeds)
    if arm is comparison.baseline:
        return [mean_cell, "-", "-", "-"]
    base = comparison.spreads[comparison.baseline.name][metric]
    resampled = comparison.bootstrap.get(arm.name, {}).get(metric)
    if seeds is not None and base is not None:
        difference: float | None = seeds.mean - base.mean
    else:
        difference = resampled.difference if resampled else None
    delta = "-" if difference is None else f"{difference:+.2f}"
    if resampled and resampled.identical_to_baseline:
        return [mean_cell, delta, "identical to the baseline", "-"]
    if resampled and resampled.low is not None and resampled.high is not None:
        delta += f" [{resampled.low:+.2f}, {resampled.high:+.2f}]"
    p_bootstrap = "-" if resampled is None or resampled.p_value is None else f"{resampled.p_value:.4f}"
    welch = comparison.welch[arm.name][metric]
    return [mean_cell, delta, p_bootstrap, "-" if welch is None else f"{welch.p_value:.4f}"]


def _spread_cell(seeds: Spread) -> str:
    if seeds.std is None or seeds.ci is None:
        return f"{seeds.mean:.2f} (1 seed)"
    return f"{seeds.mean:.2f} ± {seeds.std:.2f} [{seeds.mean - seeds.ci:.2f}, {seeds.mean + seeds.ci:.2f}]"


def arm_notes(comparison: ArmComparison) -> list[str]:
    """What the table over seeds shows and how it was tested; then why arms were left out."""
    notes = [
        f"Over seeds: the runs of each arm differ by their seed only. Mean ± sample standard deviation "
        f"of the seeds' {comparison.split} scores [95% Student-t interval]; Δ: the arm's mean minus the "
        f"baseline arm {comparison.baseline.name}'s. p (Welch): Welch's t-test over the seeds' scores "
        "(two seeds per arm at least)."
    ]
    if comparison.bootstrap:
        seed = bootstrap_seed()
        notes.append(
            f"Δ's [95% CI] and p (bootstrap): paired bootstrap ({comparison.num_samples} resamples, seed "
            f"{'none' if seed is None else seed}) drawing the test sentences and each arm's seeds with "
            "replacement, so both test-set sampling and seed-to-seed variance count."
        )
    return notes + comparison.notes
