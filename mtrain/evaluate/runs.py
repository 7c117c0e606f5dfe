"""Run discovery: the runs of a sweep (or a list of run directories) and what they recorded.

A Hydra multirun directory holds one numbered subdirectory per run, each with
`.hydra/overrides.yaml` (the command-line overrides of that run), `metrics.json` (written
by the trainer) and `eval/<split>.json|hyp` (written by `mtrain eval` or the trainer); a job
that failed has `failed.json` (its reason and overrides, written by mtrain.cli.common).
`mtrain eval runs=...` and `mtrain report` both start here; what one run directory says about
itself is read by mtrain.run_summary.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mtrain.errors import MtrainError
from mtrain.run_summary import RunSummary, load_run_summary
from mtrain.rundir import RunDir


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
