"""What one run directory says about itself: its command-line overrides, metrics.json, its
eval reports and, for a sweep job that failed, why.

Read by the runs table and sweep reports (mtrain.evaluate.runs discovers a sweep's runs) and
by an export's model card (mtrain.export.model_card): the run directory's record, below both.
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


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise MtrainError(f"{path}: not valid JSON ({error}); was the run interrupted while writing it?") from error
    if not isinstance(data, dict):
        raise MtrainError(f"{path}: expected a JSON object")
    return data
