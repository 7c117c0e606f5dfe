"""Arms: the runs of one configuration trained with different seeds, grouped.

A sweep `model.x=a,b seed=1,2,3` holds two arms of three runs each. What sets an arm apart
is a run's overrides less `seed` and Hydra's own `hydra.*` keys; its seed is the config's
`seed` (config.yaml), else the `seed=` override. Runs of one arm must have different seeds:
runs whose overrides say nothing (a list of run directories without `.hydra/`) or that
repeat a seed are not replicates, and each stays an arm of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import yaml

from mtrain.errors import MtrainError
from mtrain.evaluate.runs import describe, differing_overrides, run_config
from mtrain.run_summary import RunSummary

SEED_KEY = "seed"


@dataclass
class Arm:
    """One configuration and its runs, one per seed (in the order the runs were given)."""

    name: str  # the first run's name
    label: str  # what sets it apart from the other arms: `key=value ...`, or '-'
    runs: list[RunSummary] = field(default_factory=list)
    seeds: list[int | None] = field(default_factory=list)  # per run

    @property
    def seeded(self) -> bool:
        return len(self.runs) > 1


def run_seed(run: RunSummary) -> int | None:
    """The seed a run trained with: config.yaml's `seed`, else its `seed=` override."""
    try:
        seed = run_config(run.path).get(SEED_KEY)
    except (MtrainError, yaml.YAMLError):  # no config.yaml, or one cut short by a killed job
        seed = None
    if seed is None:
        seed = run.overrides.get(SEED_KEY)
    try:
        return None if seed is None else int(seed)
    except ValueError:
        return None


def arm_overrides(run: RunSummary) -> tuple[tuple[str, str], ...]:
    """The overrides that define a run's arm: all but the seed and Hydra's own."""
    return tuple(
        sorted((key, value) for key, value in run.overrides.items() if key != SEED_KEY and not key.startswith("hydra."))
    )


def group_arms(runs: Sequence[RunSummary]) -> list[Arm]:
    """The runs' arms in first-run order. A failed job is an arm's run too (it has no score)."""
    seeds = [run_seed(run) for run in runs]
    groups: dict[tuple[tuple[str, str], ...], list[int]] = {}
    for index, run in enumerate(runs):
        key = arm_overrides(run)
        groups.setdefault(key, []).append(index)
    members: list[list[int]] = []
    for key, indices in groups.items():
        group_seeds = [seeds[index] for index in indices]
        replicates = bool(key) and None not in group_seeds and len(set(group_seeds)) == len(group_seeds)
        members += [indices] if replicates else [[index] for index in indices]
    members.sort(key=lambda indices: indices[0])
    # The arms' labels name the keys that differ between arms, not between seeds.
    firsts = [runs[indices[0]] for indices in members]
    keys = [key for key in differing_overrides(firsts) if key != SEED_KEY and not key.startswith("hydra.")]
    arms = []
    for indices in members:
        first = runs[indices[0]]
        arms.append(
            Arm(
                name=first.name,
                label=describe(first, keys),
                runs=[runs[index] for index in indices],
                seeds=[seeds[index] for index in indices],
            )
        )
    return arms


def has_seed_replicates(arms: Sequence[Arm]) -> bool:
    return any(arm.seeded for arm in arms)


def arm_of(arms: Sequence[Arm], run_name: str) -> Arm:
    for arm in arms:
        if any(run.name == run_name for run in arm.runs):
            return arm
    raise MtrainError(f"run {run_name}: in no arm")
