"""Where training is, and the rules that read it: best checkpoint, patience, when validation is
due, how far training has come (`training_progress`, which the training lines say).

`TrainState` is everything besides tensors that a resumed run must restore (it is stored in
every checkpoint as a plain dict). The rules are plain functions of it and of the typed
`TrainConfig`, checked without a model (tests/test_trainer.py); the rules of the budgets that
end training read it too (`mtrain.train.budget.budget_reason`).
"""

from __future__ import annotations

from dataclasses import dataclass

from mtrain.config import TrainConfig
from mtrain.durations import format_duration, parse_duration


@dataclass
class TrainState:
    """Where training is: everything besides tensors that a resumed run must restore."""

    update: int = 0
    epoch: int = 1
    batch_in_epoch: int = 0  # this rank's batches of `epoch` already consumed
    train_seconds: float = 0.0  # wall time of training updates (validation and saving excluded)
    best_score: float = float("-inf")  # val BLEU, or minus val loss when valid_bleu is off
    best_update: int = 0
    validations_without_gain: int = 0
    skipped_updates: int = 0
    # The training time planned (the schedule's horizon: mtrain.train.budget); None: no time budget.
    train_budget_seconds: float | None = None
    # The run's wall time up to this point, over every session (for train.max_time).
    wall_seconds: float = 0.0
    # The loss curve's open point (mtrain.train.loss_curve; rank 0's): a resume closes it unbroken.
    loss_point: dict[str, float] | None = None

    def record_validation(self, results: dict[str, float]) -> bool:
        """Fold a validation's results into best and patience; True when it is the best so far.

        The score is BLEU when measured, else minus the loss (higher is better either way);
        a tie is no gain.
        """
        score = results["bleu"] if "bleu" in results else -results["loss"]
        if score > self.best_score:
            self.best_score = score
            self.best_update = self.update
            self.validations_without_gain = 0
            return True
        self.validations_without_gain += 1
        return False


class ValidationRhythm:
    """When validation is due: every `validate_every` updates, and every `validate_every_time`
    of training time, measured on the saved training clock (a resumed run keeps its rhythm)."""

    def __init__(self, train_cfg: TrainConfig) -> None:
        self.every_updates = train_cfg.validate_every
        self.every_seconds = parse_duration(train_cfg.validate_every_time, "train.validate_every_time")
        self.last_seconds = 0.0  # the training clock at the last validation

    def by_updates(self, state: TrainState) -> bool:
        return state.update % self.every_updates == 0

    def by_time(self, state: TrainState) -> bool:
        """This rank's view of the time rule (under DDP the ranks agree on it: mtrain.train.agreement)."""
        return self.every_seconds is not None and state.train_seconds >= self.last_seconds + self.every_seconds


@dataclass(frozen=True)
class TrainingProgress:
    """How far training is, as a training line says it: the update against train.max_updates,
    the share of the planned training time spent, and the training time left by whichever
    budget ends first (validation and the test decode come on top)."""

    update: int
    max_updates: int | None
    planned_seconds: float | None  # a time budget's training time (None: none)
    share_spent: float | None  # of `planned_seconds`
    seconds_left: float | None  # None: nothing to estimate it from (no budget, no update timed yet)

    def describe(self) -> str:
        """Where training is: 'update 120/2000', 'update 120 | 35% of 20m00s'."""
        text = f"update {self.update}" + (f"/{self.max_updates}" if self.max_updates is not None else "")
        if self.planned_seconds is not None and self.share_spent is not None:
            text += f" | {100 * self.share_spent:.0f}% of {format_duration(self.planned_seconds)}"
        return text

    def describe_left(self) -> str | None:
        """'~3m20s of training left' (None: nothing to estimate it from)."""
        return None if self.seconds_left is None else f"~{format_duration(self.seconds_left)} of training left"


def training_progress(state: TrainState, max_updates: int | None, seconds_per_update: float | None) -> TrainingProgress:
    """Where `state` stands against the budgets; `seconds_per_update`: the training clock's
    seconds per update so far (None: none timed yet), from which the updates left are timed."""
    lefts = []
    if max_updates is not None and seconds_per_update is not None:
        lefts.append(max(max_updates - state.update, 0) * seconds_per_update)
    planned, share = state.train_budget_seconds, None
    if planned:
        lefts.append(max(planned - state.train_seconds, 0.0))
        share = min(state.train_seconds / planned, 1.0)
    return TrainingProgress(state.update, max_updates, planned, share, min(lefts) if lefts else None)
