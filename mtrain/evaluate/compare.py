"""Comparing runs: one table of what differs and what it scored, plus sacreBLEU's paired
bootstrap resampling of every run against a baseline on the saved test hypotheses.

Runs of one configuration trained with several seeds are one arm (arms.py): then the runs are
compared arm against arm over their seeds (arm_comparison.py), never seed against seed.

The bootstrap is sacreBLEU's own `PairedTest` (what `sacrebleu REF -i BASE SYS --paired-bs`
runs), so its means, 95% confidence intervals and p-values match the command line's for the
same files, seed (`$SACREBLEU_SEED`, default 12345) and number of resamples.

A run whose hypotheses are the baseline's, line for line, gets no p-value: sacreBLEU reports
its smallest p (0.001 for 1000 resamples) for two identical systems, which reads as a
significant difference. The table says "identical to the baseline" instead.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sacrebleu.significance import PairedTest

from mtrain.errors import MtrainError
from mtrain.evaluate.arm_comparison import ArmComparison, arm_notes, compare_arms
from mtrain.evaluate.arms import group_arms, has_seed_replicates
from mtrain.evaluate.metrics import build_metric, check_lengths, check_metric_names, read_lines
from mtrain.evaluate.runs import describe, differing_overrides, report_name, run_config
from mtrain.evaluate.tables import Table, format_cell, format_duration
from mtrain.run_summary import RunSummary
from mtrain.rundir import RunDir

_DISPLAY = {"bleu": "BLEU", "chrf": "chrF", "ter": "TER"}


@dataclass
class PairedResult:
    """One system's score on one metric, with the bootstrap estimate of its true mean."""

    score: float
    mean: float
    ci: float  # half-width of the 95% confidence interval around `mean`
    p_value: float | None = None  # None for the baseline itself and for a copy of its output
    identical_to_baseline: bool = False  # the system's hypotheses are the baseline's, line for line


@dataclass
class Comparison:
    runs: list[RunSummary]
    keys: list[str]  # overrides whose values differ between runs
    split: str = "test"
    baseline: str | None = None
    # run name -> metric -> result; runs without hypotheses are absent (see `skipped`).
    paired: dict[str, dict[str, PairedResult]] = field(default_factory=dict)
    signatures: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # run name -> why
    num_samples: int = 0
    bootstrap_note: str | None = None  # why there is no bootstrap, when there is none
    # One direction of multilingual runs (src, tgt), and the report each run keeps of it:
    # `<split>.<src>-<tgt>` of a multilingual run, `<split>` of a run of that one direction.
    direction: tuple[str, str] | None = None
    reports: dict[str, str] = field(default_factory=dict)  # run name -> report name
    # Set when some configuration was trained with several seeds: the comparison by arm.
    over_seeds: ArmComparison | None = None

    def table(self) -> Table:
        return runs_table(self.runs, self.keys, self)


def paired_bootstrap(
    named_hyps: Sequence[tuple[str, Sequence[str]]],
    refs: Sequence[Sequence[str]],
    metrics: Sequence[str] = ("bleu", "chrf"),
    num_samples: int = 1000,
    tokenize: str = "13a",
    lowercase: bool = False,
    chrf_word_order: int = 0,
) -> tuple[dict[str, dict[str, PairedResult]], dict[str, str]]:
    """Paired bootstrap resampling of systems 2..n against the first (the baseline).

    Returns `(results[system][metric], signatures[metric])`; signatures carry the seed and
    the number of resamples.
    """
    names = check_metric_names(metrics)
    if len(named_hyps) < 2:
        raise MtrainError("paired bootstrap needs at least two runs with hypotheses")
    if num_samples < 1:
        raise MtrainError(f"bootstrap_samples={num_samples}: must be at least 1")
    for system, hyps in named_hyps:
        check_lengths(len(hyps), [len(stream) for stream in refs], f"hypotheses of {system}")
    refs = [list(stream) for stream in refs]
    # Metrics cache the references' statistics, as the command line sets them up.
    sacre_metrics = {
        name.upper(): build_metric(name, tokenize, lowercase, chrf_word_order, references=refs) for name in names
    }
    # sacreBLEU narrates each step at INFO; the table says it all.
    logging.getLogger("sacrebleu").setLevel(logging.WARNING)
    test = PairedTest(
        [(system, list(hyps)) for system, hyps in named_hyps],
        sacre_metrics,
        references=None,
        test_type="bs",
        n_samples=num_samples,
    )
    signatures, scores = test()
    # `scores` is keyed by the metrics' display names (BLEU, chrF2++, TER) in our order.
    display_names = [key for key in scores if key != "System"]
    results: dict[str, dict[str, PairedResult]] = {system: {} for system, _ in named_hyps}
    baseline_hyps = list(named_hyps[0][1])
    for name, display in zip(names, display_names, strict=True):
        for index, ((system, hyps), result) in enumerate(zip(named_hyps, scores[display], strict=True)):
            identical = index > 0 and list(hyps) == baseline_hyps
            assert not isinstance(result, str)  # (the "System" column holds the names)
            assert result.mean is not None and result.ci is not None  # a bootstrap test's results have both
            results[system][name] = PairedResult(
                float(result.score),
                float(result.mean),
                float(result.ci),
                None if result.p_value is None or identical else float(result.p_value),
                identical_to_baseline=identical,
            )
    return results, {name: signatures[display].format() for name, display in zip(names, display_names, strict=True)}


def compare_runs(
    runs: list[RunSummary],
    refs: Sequence[Sequence[str]] | None,
    baseline: str | None = None,
    split: str = "test",
    metrics: Sequence[str] = ("bleu", "chrf"),
    num_samples: int = 1000,
    tokenize: str = "13a",
    lowercase: bool = False,
    chrf_word_order: int = 0,
    direction: tuple[str, str] | None = None,
) -> Comparison:
    """The comparison of `runs`, with the paired bootstrap when two runs have hypotheses.

    `refs` (reference streams) default to the split of the runs' data config. `direction`
    (src, tgt): compare that direction, of multilingual runs and of runs trained on it alone.
    """
    if not runs:
        raise MtrainError("runs: no runs to compare")
    ordered = _baseline_first(runs, baseline)
    reports = {run.name: report_name(run, split, direction) for run in ordered}
    comparison = Comparison(
        runs=ordered,
        keys=differing_overrides(ordered),
        split=split,
        baseline=ordered[0].name,
        num_samples=num_samples,
        direction=direction,
        reports={name: report for name, report in reports.items() if report is not None},
    )
    direction_name = None if direction is None else f"{direction[0]}-{direction[1]}"
    shown = split if direction_name is None else f"{split} {direction_name}"

    def hyp_path(run: RunSummary) -> Path | None:
        report = reports[run.name]
        return None if report is None else run.hyp_path(report)

    with_hyps = [run for run in ordered if (path := hyp_path(run)) is not None and path.is_file()]
    comparison.skipped = {
        run.name: "the job failed"
        if run.failure
        else f"it does not translate {direction_name}"
        if (path := hyp_path(run)) is None
        else f"no {path.relative_to(run.path)}"
        for run in ordered
        if run not in with_hyps
    }
    arms = group_arms(ordered)  # the baseline's arm first, as the baseline is the first run
    if has_seed_replicates(arms):
        comparison.bootstrap_note = (
            "runs that differ by their seed only are one arm: they are compared arm against arm over "
            "their seeds (the table over seeds), not run against run"
        )
        refs_note = None
        if refs is None and len(with_hyps) > 1 and num_samples:
            refs, refs_note = split_references(ordered, split, direction)
        hyp_paths = {run.name: path for run in with_hyps if (path := hyp_path(run)) is not None}
        comparison.over_seeds = compare_arms(
            arms,
            comparison.reports,
            hyp_paths,
            refs,
            shown,
            metrics,
            num_samples,
            tokenize,
            lowercase,
            chrf_word_order,
            refs_note,
        )
        return comparison
    if len(with_hyps) < 2:
        comparison.bootstrap_note = f"no paired bootstrap: fewer than two runs have {shown} hypotheses"
        return comparison
    if with_hyps[0] is not ordered[0]:
        raise MtrainError(
            f"baseline {ordered[0].name}: has no {shown} hypotheses ({hyp_path(ordered[0]) or 'no such direction'}); "
            f"run `mtrain eval run={ordered[0].path} split={split}` first or choose another baseline="
        )
    if refs is None:
        refs, why = split_references(ordered, split, direction)
        if refs is None:
            comparison.bootstrap_note = f"no paired bootstrap: {why}"
            return comparison
    named_hyps = []
    for run in with_hyps:
        path = hyp_path(run)
        assert path is not None  # (with_hyps)
        hyps = read_lines(path, "hypotheses")
        check_lengths(len(hyps), [len(stream) for stream in refs], str(path))
        named_hyps.append((run.name, hyps))
    comparison.paired, comparison.signatures = paired_bootstrap(
        named_hyps, refs, metrics, num_samples, tokenize, lowercase, chrf_word_order
    )
    return comparison


# The keys of a data config that decide which sentences a split holds.
_SPLIT_KEYS = ("name", "src", "tgt", "local_dir", "format", "pattern", "hub.id", "hub.config")


def split_references(
    runs: Sequence[RunSummary], split: str = "test", direction: tuple[str, str] | None = None
) -> tuple[list[list[str]] | None, str | None]:
    """The references of `split` for comparing `runs`: the copy kept by the first run that
    names its data (older runs: read through its data config); `(None, why)` when unreadable
    or the runs name different data. `direction`: that direction's split (the runs' data
    sections may then name other languages: a multilingual run's and a bilingual run's)."""
    from omegaconf import OmegaConf

    from mtrain.evaluate.references import read_run_split

    described = {}
    for run in runs:
        try:
            data = run_config(run.path).data
        except MtrainError:
            continue
        keys = [f"splits.{split}"] + [key for key in _SPLIT_KEYS if direction is None or key not in ("src", "tgt")]
        described[run.name] = (data, tuple(str(OmegaConf.select(data, key)) for key in keys))
    if not described:
        return None, "no run has a config.yaml naming its data; pass the references with ref=FILE"
    if len({fingerprint for _, fingerprint in described.values()}) > 1:
        return None, (
            f"the runs' data configs name different {split} sets "
            f"({', '.join(described)}); pass the common references with ref=FILE"
        )
    first = next(iter(described))
    data = described[first][0]
    run_dir = next(run.path for run in runs if run.name == first)
    try:  # the run's own copy of the split, so a relative MTRAIN_DATA_DIR or the Hub is not needed again
        return read_run_split(RunDir(run_dir), data, split, direction).references, None
    except MtrainError as error:
        return None, f"the {split} references could not be read ({error}); pass them with ref=FILE"


def _baseline_first(runs: list[RunSummary], baseline: str | None) -> list[RunSummary]:
    if baseline is None or baseline == "":
        return list(runs)
    for index, run in enumerate(runs):
        if str(baseline) in (run.name, str(run.path)) or _same_path(run.path, baseline):
            return [run] + runs[:index] + runs[index + 1 :]
    raise MtrainError(f"baseline={baseline}: not one of the runs ({', '.join(run.name for run in runs)})")


def _same_path(path: Path, other: str) -> bool:
    try:
        return path.resolve() == Path(other).resolve()
    except OSError:
        return False


def runs_table(runs: Sequence[RunSummary], keys: Sequence[str], comparison: Comparison | None = None) -> Table:
    """One row per run: what differs, validation/test scores, how training went, and (when
    a comparison with bootstrap results is given) each metric's mean ± 95% CI and p-value."""
    split = comparison_split = comparison.split if comparison else "test"
    if comparison and comparison.direction:
        split = f"{split} {comparison.direction[0]}-{comparison.direction[1]}"
    headers = [
        "run",
        "differs",
        "val BLEU",
        f"{split} BLEU",
        f"{split} chrF",
        "final loss",
        "diverged",
        "updates",
        "train time",
    ]
    paired_metrics = list(next(iter(comparison.paired.values())).keys()) if comparison and comparison.paired else []
    for metric in paired_metrics:
        headers += [f"{_DISPLAY.get(metric, metric)} μ ± 95% CI", f"p ({_DISPLAY.get(metric, metric)})"]
    table = Table(headers)
    for run in runs:
        name = run.name + (
            " (baseline)" if comparison and comparison.paired and run.name == comparison.baseline else ""
        )
        report = comparison.reports.get(run.name) if comparison and comparison.direction else comparison_split
        test_bleu, test_chrf = (run.score(report, "bleu"), run.score(report, "chrf")) if report else (None, None)
        cells = [
            name,
            describe(run, keys),
            run.score("valid", "bleu"),
            test_bleu,
            test_chrf,
            _number(run.metrics.get("final_train_loss"), 3),
            run.diverged,
            run.metrics.get("updates"),
            format_duration(run.metrics.get("train_time_s")),
        ]
        for metric in paired_metrics:
            result = comparison.paired.get(run.name, {}).get(metric) if comparison else None
            if result is None:
                cells += ["-", "-"]
            else:
                p_cell = (
                    "identical to the baseline"
                    if result.identical_to_baseline
                    else "-"
                    if result.p_value is None
                    else f"{result.p_value:.4f}"
                )
                cells += [f"{result.mean:.2f} ± {result.ci:.2f}", p_cell]
        table.add(*cells)
    return table


def _number(value: object, digits: int) -> str:
    return format_cell(float(value), digits) if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def comparison_notes(comparison: Comparison) -> list[str]:
    """Lines to print under the table: the test, the signatures, runs left out."""
    notes = []
    if comparison.paired:
        notes.append(
            f"Paired bootstrap resampling ({comparison.num_samples} resamples, sacreBLEU) on the "
            f"{comparison.split} hypotheses, each run against the baseline {comparison.baseline}; "
            "p is the probability of a score difference this large arising by chance."
        )
        notes += [f"{_DISPLAY.get(metric, metric)} signature: {sig}" for metric, sig in comparison.signatures.items()]
        for name, results in comparison.paired.items():
            if any(result.identical_to_baseline for result in results.values()):
                notes.append(
                    f"run {name}: its {comparison.split} hypotheses are identical to the baseline "
                    f"{comparison.baseline}'s, so there is no difference to test (no p-value)"
                )
    elif comparison.bootstrap_note:
        notes.append(comparison.bootstrap_note)
    for name, why in comparison.skipped.items():
        notes.append(f"run {name}: left out of the bootstrap ({why})")
    if comparison.over_seeds:
        notes += arm_notes(comparison.over_seeds)
    return notes
