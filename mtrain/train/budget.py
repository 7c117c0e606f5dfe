"""A run's time budget, and the training time the learning-rate schedule plans for.

Two keys set it. `train.max_time` is the wall time of the whole run: from the command's start
through data preparation, training, validations, checkpoints and the test decode, to its last
line. `train.max_train_time` is the training clock alone (updates; validation and saving
excluded), what a benchmark that compares toolkits by training time fixes. Either, both (each
a cap) or neither (an update or epoch budget) may be set.

Under max_time the training share is planned: what is left of the budget once the time spent
before the first update and the cost of what comes after the last one (`EndCost`: a
validation, its checkpoints, the test decode) are set aside, less what periodic validations
and saves take per second of training. The end cost is measured on this machine just before
the first update (mtrain fit times a few decoding steps: mtrain.decode.translation.cost), measured again
during training (other jobs may have started on the machine since: `measure_due`), and
corrected by every validation's measured time; the plan is made again after each validation
and each measurement, and kept in the training state (`TrainState.train_budget_seconds`),
which the schedule's progress divides by and every checkpoint saves: a resumed run continues
the curve it was on. If the machine gets slower than planned, training stops early, when the
time left would only just cover what follows it: a shorter schedule rather than an overrun.
What still overruns (a decode slower than measured) is bounded by the test decode itself,
which stops at the deadline (mtrain.cli.fit_scoring). `budget_reason` is every rule that ends
training by a budget or by patience; `mtrain.train.budget_keeper` applies them to the trainer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mtrain.config import TrainConfig
from mtrain.durations import format_duration, parse_duration

if TYPE_CHECKING:
    from mtrain.train.progress import TrainState

# Checkpoint writing until the first save is timed: last.pt (weights and Adam's two moments),
# update_N.pt and best.pt hold about 5 copies of the weights, at a disk's 100 MB/s.
CHECKPOINT_COPIES = 5
DISK_BYTES_PER_S = 100e6
# The end cost is measured again during training (the machine's load changes): at least a
# minute apart, and at most 1/50 of the time (measuring the CPU preset's takes ~1-2 s).
MEASURE_INTERVAL_S = 60.0
MEASURE_EVERY = 50


@dataclass(frozen=True)
class EndCost:
    """Seconds of what a run does after its last update: a validation, the checkpoints written
    after it, and the test decode with its scoring (0 without a test split)."""

    validation: float
    save: float
    test: float

    @property
    def total(self) -> float:
        return self.validation + self.save + self.test

    def describe(self) -> str:
        """'validation ~9 s, checkpoints ~1 s, test decode ~18 s'."""
        parts = [f"validation ~{format_duration(self.validation)}", f"checkpoints ~{format_duration(self.save)}"]
        if self.test > 0:
            parts.append(f"test decode ~{format_duration(self.test)}")
        return ", ".join(parts)


def save_seconds_guess(weight_bytes: int) -> float:
    """Seconds to write a validation's checkpoints before any has been timed."""
    return CHECKPOINT_COPIES * weight_bytes / DISK_BYTES_PER_S


def configured_training_budget(cfg: TrainConfig) -> float | None:
    """The training clock's budget before any plan: max_train_time, else max_time (all of it, an
    upper bound), None without a time budget."""
    max_train = parse_duration(cfg.max_train_time, "train.max_train_time")
    return max_train if max_train is not None else parse_duration(cfg.max_time)


def resumed_training_budget(saved: TrainConfig | None, current: TrainConfig, planned: float | None) -> float | None:
    """The training budget a resumed run continues with: the one its checkpoint `planned`, moved
    by as much as max_time was raised or lowered since, within max_train_time. None when the
    run has it planned afresh (max_time set now, no plan saved: a run that had no max_time)."""
    max_seconds = parse_duration(current.max_time)
    max_train = parse_duration(current.max_train_time, "train.max_train_time")
    if max_seconds is None:
        return max_train
    saved_max = parse_duration(saved.max_time) if saved is not None else None
    if planned is None and saved_max is not None:
        planned = saved_max  # written before max_time covered the whole run: all of it was training
    if planned is None:
        return None
    budget = planned + max_seconds - (saved_max if saved_max is not None else max_seconds)
    return budget if max_train is None else min(budget, max_train)


def budget_name(cfg: TrainConfig, budget_seconds: float | None) -> str:
    """Which key a training budget of `budget_seconds` comes from: 'max_time=2m' or 'max_train_time=20m'."""
    max_train = parse_duration(cfg.max_train_time, "train.max_train_time")
    if cfg.max_time is None or (max_train is not None and budget_seconds is not None and budget_seconds >= max_train):
        return f"max_train_time={cfg.max_train_time}"
    return f"max_time={cfg.max_time}"


def budget_reason(state: TrainState, train_cfg: TrainConfig, out_of_time: bool | None = None) -> str | None:
    """Why training at `state` is done under `train_cfg`'s budget and patience (None: not done).

    `out_of_time` overrides the time test (ranks agree on it); by default it is whether
    `state.train_seconds` has reached the planned training time (`state.train_budget_seconds`,
    else the configured one).
    """
    if train_cfg.max_updates is not None and state.update >= train_cfg.max_updates:
        return f"max_updates={train_cfg.max_updates} reached"
    budget = state.train_budget_seconds
    if budget is None:
        budget = configured_training_budget(train_cfg)
    if out_of_time is None:
        out_of_time = budget is not None and state.train_seconds >= budget
    if out_of_time:
        return f"{budget_name(train_cfg, budget)} reached"
    if train_cfg.patience is not None and state.validations_without_gain >= train_cfg.patience:
        return f"no val-BLEU gain in {train_cfg.patience} validations (patience)"
    return None


class RunBudget:
    """Where a run stands against max_time: its deadline, the end cost set aside, the training
    share planned (see the module docstring). Without max_time it only answers
    max_train_time."""

    def __init__(self, train_cfg: TrainConfig, started: float, clock: Callable[[], float] = time.monotonic) -> None:
        """`started`: `clock()` when the command started (its wall time counts from there)."""
        self.cfg = train_cfg
        self.max_seconds = parse_duration(train_cfg.max_time)
        self.max_train_seconds = parse_duration(train_cfg.max_train_time, "train.max_train_time")
        self.started = started
        self.clock = clock
        self.spent_before = 0.0  # wall seconds of a resumed run's earlier sessions, to its checkpoint
        self.estimated: EndCost | None = None  # as measured before the first update
        self.measured: EndCost | None = None  # as measured last (before the first update, or since)
        self.measured_at: float | None = None  # `clock()` when it was
        self.measure_seconds = 0.0  # what measuring it took
        # What a validation took over what was measured for it then: the decodes' error (a
        # trained model's output lengths, the decoding threads' share of busy cores).
        self.validation_ratio: float | None = None
        self.save_seconds: float | None = None  # the last save of a validation's checkpoints, timed
        self.overhead_seconds = 0.0  # this session's mid-run validations, saves and measurements
        self.session_train_start: float | None = None  # the training clock when this session began
        self.every_seconds = parse_duration(train_cfg.validate_every_time, "train.validate_every_time")

    @property
    def deadline(self) -> float | None:
        """`clock()` time by which the whole run must end (None: no max_time)."""
        if self.max_seconds is None:
            return None
        return self.started + self.max_seconds - self.spent_before

    @property
    def cost(self) -> EndCost | None:
        """What follows training: as last measured, corrected by what a validation and a save took."""
        if self.measured is None:
            return None
        ratio = self.validation_ratio if self.validation_ratio is not None else 1.0
        save = self.save_seconds if self.save_seconds is not None else self.measured.save
        return EndCost(self.measured.validation * ratio, save, self.measured.test * ratio)

    def wall_seconds(self) -> float:
        """The run's wall time so far, its earlier sessions' (to their last checkpoint) included."""
        return self.spent_before + self.clock() - self.started

    def set_estimate(self, cost: EndCost, seconds: float = 0.0) -> None:
        """What follows training, measured now in `seconds`; the first measurement is the run's estimate."""
        if self.estimated is None:
            self.estimated = cost
        self.measured, self.measured_at, self.measure_seconds = cost, self.clock(), seconds

    def measure_due(self) -> bool:
        """Time to measure the end cost again: the machine's load may have changed since. Every
        minute at least, and seldom enough that measuring takes at most 1/MEASURE_EVERY of the time."""
        if self.deadline is None or self.measured_at is None:
            return False
        every = max(MEASURE_INTERVAL_S, MEASURE_EVERY * self.measure_seconds)
        return self.clock() - self.measured_at >= every

    def note_validation(self, seconds: float) -> None:
        """A validation took `seconds`: the last one will take about as long, and the test decode
        what was measured times as much longer (or shorter) as this one took than measured."""
        if self.measured is None:
            return
        self.validation_ratio = seconds / self.measured.validation if self.measured.validation > 0 else 1.0

    def note_save(self, seconds: float) -> None:
        self.save_seconds = seconds

    def note_overhead(self, seconds: float) -> None:
        """A mid-run validation, save or measurement took `seconds` of wall time off the training clock."""
        self.overhead_seconds += seconds

    def overhead_rate(self, train_seconds: float) -> float:
        """Wall seconds of validations and saves per second of training still to come: as
        measured in this session once there were some, else as train.validate_every_time says."""
        session = train_seconds - (self.session_train_start or 0.0)
        cost = self.cost
        if self.overhead_seconds > 0 and session > 0:
            return self.overhead_seconds / session
        if self.every_seconds is not None and cost is not None:
            return (cost.validation + cost.save) / self.every_seconds
        return 0.0

    def begin(self, train_seconds: float, spent_before: float) -> None:
        """A session starts training at `train_seconds` on the training clock, `spent_before`
        wall seconds into the run (a resumed run's earlier sessions, to its checkpoint)."""
        self.session_train_start = train_seconds
        self.spent_before = spent_before

    def plan(self, train_seconds: float) -> float | None:
        """The training clock's budget from here: under max_time, `train_seconds` plus the wall
        time left after the end cost, shared with the validations and saves to come; within
        max_train_time."""
        deadline = self.deadline
        if deadline is None:
            return self.max_train_seconds
        cost = self.cost
        reserve = cost.total if cost is not None else 0.0
        left = max(deadline - self.clock() - reserve, 0.0)
        planned = train_seconds + left / (1.0 + self.overhead_rate(train_seconds))
        return planned if self.max_train_seconds is None else min(planned, self.max_train_seconds)

    def must_stop(self, next_update: float = 0.0) -> bool:
        """The wall clock leaves no room for another update of `next_update` seconds before what
        follows training."""
        deadline, cost = self.deadline, self.cost
        if deadline is None or cost is None:
            return False
        return self.clock() + next_update + cost.total >= deadline

    def seconds_left(self) -> float | None:
        deadline = self.deadline
        return None if deadline is None else deadline - self.clock()
