"""Run discovery: the runs of a sweep (or a list of run directories) and what they recorded.

A Hydra multirun directory holds one numbered subdirectory per run, each with
`.hydra/overrides.yaml` (the command-line overrides of that run), `metrics.json` (written
by the trainer) and `eval/<split>.json|hyp` (written by `mtrain eval` or the trainer); a job
that failed has `failed.json` (its reason and overrides, written by mtrain.cli.common).
`mtrain eval runs=...` and `mtrain report` both start here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mtrain.errors import MtrainError
from mtrain.rundir import RunDir


@dataclass
class RunSummary:
    """What one run directory says about itself (absent files give empty values)."""

    name: str
    path: Path
    overrides: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)  # metrics.json
    evals: dict[str, dict[str, Any]] = field(default_factory=dict)  # eval/<split>.json by split
    failure: str | None = None  # why the sweep job failed (failed.json), None if it did not

    def hyp_path(self, split: str = "test") -> Path:
        return RunDir(self.path).eval_file(split, "hyp")

    def score(self, split: str, metric: str = "bleu") -> float | None:
        """A split's score: `mtrain eval`'s report if there is one, else metrics.json."""
        report = self.evals.get(split, {}).get("metrics", {}).get(metric)
        if isinstance(report, dict) and "score" in report:
            return float(report["score"])
        recorded = self.metrics.get(split) or {}
        # The trainer records the best validation score as `best_<metric>`.
        value = recorded.get(metric, recorded.get(f"best_{metric}"))
        if isinstance(value, dict):
            value = value.get("score")
        return float(value) if isinstance(value, (int, float)) else None

    @property
    def diverged(self) -> bool | None:
        value = self.metrics.get("diverged")
        return bool(value) if value is not None else None


def discover_runs(spec: str) -> list[RunSummary]:
    """Runs of a sweep directory, or of a comma-separated list of run directories."""
    spec = str(spec).strip()
    if not spec:
        raise MtrainError("runs: empty; give a sweep directory or run directories separated by commas")
    if "," in spec:
        paths = [Path(part.strip()) for part in spec.split(",") if part.strip()]
        for path in paths:
            if not path.is_dir():
                raise MtrainError(f"runs: {path}: no such run directory")
        names = [path.name for path in paths]
        if len(set(names)) < len(names):
            names = [str(path) for path in paths]
        return [load_run_summary(path, name) for path, name in zip(paths, names, strict=True)]

    root = Path(spec)
    if not root.is_dir():
        raise MtrainError(f"runs={root}: no such directory")
    if RunDir(root).looks_like_run():  # one run given for a sweep: a table of that run
        return [load_run_summary(root, root.name)]
    # (hidden directories are no runs: a run's own .hydra/ holds a config.yaml)
    children = sorted(
        (p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".") and RunDir(p).looks_like_run()),
        key=_run_order,
    )
    if children:
        return [load_run_summary(path, path.name) for path in children]
    raise MtrainError(
        f"runs={root}: no runs found; expected a Hydra multirun directory (subdirectories "
        f"0/, 1/, ... with .hydra/overrides.yaml or metrics.json) or run directories separated by commas"
    )


def _run_order(path: Path) -> tuple[int, int, str]:
    # Hydra numbers jobs 0, 1, ..., 10: sort numerically, not as strings.
    return (0, int(path.name), "") if path.name.isdigit() else (1, 0, path.name)


def load_run_summary(path: Path, name: str | None = None) -> RunSummary:
    path = Path(path)
    run = RunDir(path)
    evals = {}
    if run.eval_dir.is_dir():
        for report in sorted(run.eval_dir.glob("*.json")):
            evals[report.stem] = _read_json(report)
    metrics_path = run.metrics_file
    failed = _read_json(run.failed_file) if run.failed_file.is_file() else {}
    overrides = read_overrides(path)
    if not overrides and failed:  # a job that failed before mtrain wrote .hydra/overrides.yaml
        overrides = parse_overrides([str(item) for item in failed.get("overrides", [])])
    return RunSummary(
        name=name or path.name,
        path=path,
        overrides=overrides,
        metrics=_read_json(metrics_path) if metrics_path.is_file() else {},
        evals=evals,
        failure=str(failed.get("error", "no reason recorded")) if failed else None,
    )


def read_overrides(run_dir: Path) -> dict[str, str]:
    """`.hydra/overrides.yaml` as {key: value}; `+`/`++` prefixes dropped, `~key` kept as deleted."""
    path = RunDir(run_dir).overrides_file
    if not path.is_file():
        return {}
    try:
        entries = yaml.safe_load(path.read_text(encoding="utf-8")) or []
    except yaml.YAMLError as error:
        raise MtrainError(f"{path}: not valid YAML ({error})") from error
    if not isinstance(entries, list):
        raise MtrainError(f"{path}: expected a list of overrides like `key=value`")
    return parse_overrides(entries)


def parse_overrides(entries: Sequence[Any]) -> dict[str, str]:
    """Overrides like `key=value` as {key: value}; `+`/`++` prefixes dropped, `~key` kept as deleted."""
    overrides = {}
    for entry in entries:
        key, _, value = str(entry).partition("=")
        if key.startswith("~"):
            overrides[key[1:]] = "(deleted)"
        else:
            overrides[key.lstrip("+")] = value
    return overrides


def run_config(run_dir: Path) -> Any:
    """The resolved config a run was trained with (`config.yaml`, else `.hydra/config.yaml`)."""
    from omegaconf import OmegaConf

    run = RunDir(run_dir)
    for path in (run.config_file, run.hydra_dir / "config.yaml"):
        if path.is_file():
            return OmegaConf.load(path)
    raise MtrainError(f"run={run_dir}: no config.yaml or .hydra/config.yaml; is it a run directory of `mtrain fit`?")


def failure_notes(runs: Sequence[RunSummary]) -> list[str]:
    """One line per failed sweep job: its name, what sets it apart, and why it failed."""
    keys = differing_overrides(runs)
    return [f"run {run.name} ({describe(run, keys)}) failed: {run.failure}" for run in runs if run.failure]


def default_baseline(
    runs: Sequence[RunSummary], split: str = "test", direction: tuple[str, str] | None = None
) -> str | None:
    """The first run that has `split` hypotheses (a failed job 0 has none), of `direction` when given."""
    for run in runs:
        report = report_name(run, split, direction)
        if report is not None and run.hyp_path(report).is_file():
            return run.name
    return None


def report_name(run: RunSummary, split: str, direction: tuple[str, str] | None) -> str | None:
    """The name of the report (eval/<name>.json|hyp) `run` keeps of `split` in `direction`:
    a multilingual run's `<split>.<src>-<tgt>`, a run that trains that one direction its
    `<split>`; None when it translates other directions. Without a direction: `split`."""
    if direction is None:
        return split
    named = f"{split}.{direction[0]}-{direction[1]}"
    if named in run.evals or run.hyp_path(named).is_file():
        return named
    from mtrain.data.tags import run_directions

    try:
        directions = run_directions(run_config(run.path).data)
    except MtrainError:
        return None
    return split if directions == [tuple(direction)] else None


def differing_overrides(runs: Sequence[RunSummary]) -> list[str]:
    """Override keys whose value is not the same in every run (in first-seen order)."""
    keys: list[str] = []
    for run in runs:
        keys += [key for key in run.overrides if key not in keys]
    if len(runs) < 2:
        return keys
    return [key for key in keys if len({run.overrides.get(key) for run in runs}) > 1]


def describe(run: RunSummary, keys: Sequence[str]) -> str:
    """The run's values of `keys` as `key=value ...` ('-' when it sets none of them)."""
    parts = [f"{key}={run.overrides[key]}" for key in keys if key in run.overrides]
    return " ".join(parts) if parts else "-"


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise MtrainError(f"{path}: not valid JSON ({error}); was the run interrupted while writing it?") from error
    if not isinstance(data, dict):
        raise MtrainError(f"{path}: expected a JSON object")
    return data
