"""The training loop: batches in, updates out, with validation and checkpoints between.

`run_update` is one update: the next batches, the learning rate, and the optimiser update
over them (`mtrain.train.step`: forward and backward over `update_freq` batches, clipping,
one step). `fit` is the loop around it: update, log, validate and
save when due, stop. The parts it runs are built elsewhere (`mtrain.train.builders`); what
validation measures is a callable given to it; where checkpoints go is the `Checkpointer`'s
business, what is reported the `MetricLogger`'s, what a checkpoint holds `checkpoint_state`'s.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from mtrain.batches import Batch
from mtrain.config import TrainConfig
from mtrain.durations import format_duration
from mtrain.errors import MtrainError
from mtrain.runtime import release_free_host_memory
from mtrain.train import checkpoint_state
from mtrain.train.budget import EndCost, RunBudget, budget_name, configured_training_budget
from mtrain.train.builders import TrainingParts
from mtrain.train.checkpointer import Checkpointer
from mtrain.train.compilation import compiled_graphs, compiling
from mtrain.train.distributed import DistributedContext
from mtrain.train.faults import StopRequested, StopSignal, is_out_of_memory
from mtrain.train.host_memory import HostMemory
from mtrain.train.instrument_log import InstrumentLog
from mtrain.train.metric_log import MetricLogger
from mtrain.train.progress import TrainState, ValidationRhythm, budget_reason
from mtrain.train.step import UpdateStep

log = logging.getLogger("mtrain")

Validate = Callable[[], dict[str, float]]  # {loss, ppl, ...; bleu when measured}


def no_validation() -> dict[str, float]:
    """The `validate` of benchmarks, which time updates and never validate."""
    raise RuntimeError("this trainer was built without validation (a benchmark)")


class TrainingInterrupted(MtrainError):
    """A stop signal ended training after a checkpoint was written; exit with `exit_status`."""

    def __init__(self, message: str, exit_status: int) -> None:
        super().__init__(message)
        self.exit_status = exit_status


class Trainer:
    def __init__(
        self,
        train_cfg: TrainConfig,
        parts: TrainingParts,
        dist: DistributedContext,
        *,
        validate: Validate = no_validation,
        checkpointer: Checkpointer | None = None,
        metrics: MetricLogger | None = None,
        record: dict[str, Any] | None = None,
        stop_signal: StopSignal | None = None,
        host_memory: HostMemory | None = None,
        budget: RunBudget | None = None,
        end_cost: Callable[[], EndCost] | None = None,
    ) -> None:
        """`checkpointer` and `metrics` are rank 0's (None elsewhere); `validate` runs on rank 0;
        `record` is stored in every checkpoint (the config, the data fingerprints); `stop_signal`
        may be installed before the trainer exists (a signal then stops training at its first
        update boundary). `budget` holds the run's clock (by default one started now);
        `end_cost`, run on rank 0 before the first update under train.max_time, measures what
        follows training (mtrain fit's: `fit_scoring.end_cost_estimate`)."""
        self.cfg = train_cfg
        self.parts = parts
        self.model = parts.model
        self.optimizer = parts.optimizer
        self.dist = dist
        self.validate = validate
        self.checkpointer = checkpointer
        self.metrics = metrics
        self.record = record or {}
        self.stop_signal = stop_signal or StopSignal()
        self._owns_stop_signal = stop_signal is None  # else its owner uninstalls it
        self.host_memory = host_memory or HostMemory(trim_every=0)
        self.instruments = InstrumentLog(parts.model, train_cfg.instruments, train_cfg.instrument_every, metrics)
        self.step = UpdateStep(parts, dist, train_cfg.clip_norm, self.instruments)
        parts.batches.draw_listener = metrics.log_draw if metrics is not None else None  # several corpora
        self.state = TrainState(train_budget_seconds=configured_training_budget(train_cfg))
        self.budget = budget or RunBudget(train_cfg, time.monotonic())
        self.end_cost = end_cost
        self._resumed = False
        self.update_seconds = 0.0  # the last update's training time: the next one's, as the budget reads it
        self.rhythm = ValidationRhythm(train_cfg)
        self.last_validation: dict[str, float] = {}
        self.validation_seconds = 0.0  # this session's, all validations
        self._clock_origin: float | None = None  # perf_counter() at train_seconds == 0
        self._last_saved_update = -1
        self._logged_train = False
        self.exhausted = False  # max_epochs done: `run_update` found no more batches
        self.compiling = compiling(train_cfg)
        # torch.compile's graphs built for this trainer (recompiles included); dynamo counts per process
        self.graphs_built = 0
        self._graphs_before = compiled_graphs() if self.compiling else 0

    # ----------------------------------------------------------------- one update
    def run_update(self) -> dict[str, Any] | None:
        """The next update, on the training clock. Returns its statistics (tensors, not floats:
        nothing here waits for the device), or None when there was none: the epochs are done
        (`exhausted`), or the batches ran out of memory and were skipped."""
        if self._clock_origin is None:
            self._clock_origin = time.perf_counter() - self.state.train_seconds
        before = self.state.train_seconds
        batches = self.parts.batches.next_update(self.state)
        self.exhausted = batches is None
        if batches is None:
            return None
        self._set_learning_rate()
        self.instruments.arm(self.state.update + 1)
        step_start = time.perf_counter()
        stats = self._guarded_step(batches)
        if self.compiling:
            self._note_compiles(batches, time.perf_counter() - step_start)
        self.state.train_seconds = time.perf_counter() - self._clock_origin
        self.update_seconds = self.state.train_seconds - before
        if stats is None:
            return None
        # A non-finite update counts (its step was skipped on the device); the skips are read,
        # and divergence detected, at log intervals and before checkpoints.
        self.state.update += 1
        self.host_memory.after_update(self.state.update)
        if self.metrics is not None:
            self.metrics.update(stats)
        return stats

    def _guarded_step(self, batches: list[Batch]) -> dict[str, Any] | None:
        try:
            stats = self.step(batches, self.state.update + 1)
        except Exception as error:
            if not is_out_of_memory(error):
                raise
            self.optimizer.zero_grad(set_to_none=True)
            shape = "x".join(str(s) for s in batches[0].tgt_input.shape)
            self.parts.out_of_memory.record_failure(shape, self.cfg.max_tokens)
            return None
        self.parts.out_of_memory.record_success()
        return stats

    def _note_compiles(self, batches: list[Batch], seconds: float) -> None:
        """Log each update in which torch.compile built a graph: the first (tracing and code
        generation), and every recompile, with the batch shape that caused it."""
        graphs = compiled_graphs() - self._graphs_before
        if graphs > self.graphs_built:
            rows, src_len = batches[0].src_tokens.shape
            log.info(
                "torch.compile: update %d built graph %d (%s, batch %dx%dx%d: rows x src_len x tgt_len) in %.1f s",
                self.state.update + 1,
                graphs,
                "the first" if self.graphs_built == 0 else "a recompile",
                rows,
                src_len,
                batches[0].tgt_input.shape[1],
                seconds,
            )
            self.graphs_built = graphs

    def _set_learning_rate(self) -> None:
        budget = self.state.train_budget_seconds
        progress = self.state.train_seconds / budget if budget else 0.0
        lr = self.parts.schedule.lr(self.state.update + 1, progress, budget)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    # ----------------------------------------------------------------- the loop
    def fit(self) -> dict[str, Any]:
        """Train until a stop condition; returns the training summary for metrics.json.

        A stop signal writes a checkpoint (no validation; one during a validation stops it)
        and raises TrainingInterrupted; the signal handlers stay installed until then, so a
        second signal is handled too.
        """
        log.info("%s", self.parts.describe(self.cfg, self.dist.world_size))
        self.stop_signal.install()
        self._start_budget()
        self._clock_origin = time.perf_counter() - self.state.train_seconds
        stop_reason = self._stop_reason()  # a resumed run may already be done
        try:
            while stop_reason is None:
                stats = self.run_update()
                if self.exhausted:
                    stop_reason = f"max_epochs={self.cfg.max_epochs} reached"
                    break
                if stats is None:  # out of memory: batch skipped
                    continue
                # The first update of a process is logged too: progress shows at once.
                if self.state.update % self.cfg.log_every == 0 or not self._logged_train:
                    self._log_train()
                elif self.metrics is not None and self.metrics.due_by_time():
                    self._log_train(read_skips=False)
                stop_reason = self._stop_reason()
                if stop_reason is None and self._validation_due():
                    self.validate_and_save(replan=True)
                    stop_reason = self._signal_stop()
                elif stop_reason is None and self._save_due():
                    self.save_without_validation()
            self._log_train()
            if stop_reason != "stop signal" and self._last_saved_update != self.state.update:
                self.validate_and_save()
                stop_reason = self._signal_stop() or stop_reason
            if stop_reason == "stop signal":
                if self._last_saved_update != self.state.update:
                    self.save_without_validation()
                log.info(
                    "training stopped: stop signal (update %d, %.0f s)", self.state.update, self.state.train_seconds
                )
                raise TrainingInterrupted(
                    f"stopped by {self.stop_signal.name} at update {self.state.update}; checkpoint written, "
                    "continue with train.resume=true",
                    128 + self.stop_signal.signum,
                )
        finally:
            if self._owns_stop_signal:
                self.stop_signal.uninstall()
        log.info("training stopped: %s (update %d, %.0f s)", stop_reason, self.state.update, self.state.train_seconds)
        return self.summary(stop_reason)

    def _stop_reason(self) -> str | None:
        if self.dist.any(self.stop_signal.requested):
            return "stop signal"
        budget = self.state.train_budget_seconds
        # Training ends nearest its plan: before an update that would end more than half past it
        # (a 7.6M model's update took 15 s on busy cores), and before one the wall clock cannot afford.
        planned_done = budget is not None and self.state.train_seconds + self.update_seconds / 2 >= budget
        # Rank 0 holds the end cost: the ranks agree on its clock, as one rank past the budget stops them all.
        out_of_time = self.dist.any(planned_done or self.budget.must_stop(self.update_seconds))
        # Named while the plan is still the plan: _stop_by_time makes it what was trained (a few
        # seconds short of max_train_time=20m), which budget_name would read as max_time's share.
        reason = budget_reason(self.state, self.cfg, out_of_time)
        if out_of_time:
            if (
                not planned_done
                and self.cfg.max_time is not None
                and reason == f"{budget_name(self.cfg, budget)} reached"
            ):
                reason = f"max_time={self.cfg.max_time} reached"  # the wall clock ended it before the plan
            self._stop_by_time(short=not planned_done)
        return reason

    def _stop_by_time(self, short: bool) -> None:
        """Training ends by time: the plan becomes what was trained (a resume of the finished run
        finds it done); when the wall clock ran out before the plan (`short`), the log says why."""
        if short and self.budget.cost is not None:
            log.info(
                "%s: training stops at %s of the %s planned: another update (~%s) would leave less than "
                "the %s kept for what follows (%s)",
                budget_name(self.cfg, self.state.train_budget_seconds),
                format_duration(self.state.train_seconds),
                format_duration(self.state.train_budget_seconds or 0.0),
                format_duration(self.update_seconds),
                format_duration(self.budget.cost.total),
                self.budget.cost.describe(),
            )
        if self.state.train_budget_seconds is not None:
            self.state.train_budget_seconds = self.state.train_seconds

    def _signal_stop(self) -> str | None:  # a signal during a validation, on any rank
        return "stop signal" if self.dist.any(self.stop_signal.requested) else None

    def _validation_due(self) -> bool:
        if self.rhythm.by_updates(self.state):
            return True
        return self.rhythm.every_seconds is not None and self.dist.any(self.rhythm.by_time(self.state))

    def _save_due(self) -> bool:
        if self.cfg.save_every is None:
            return False  # no collective per update when there is no interval to check
        # Rank 0 owns the clock of saves; every rank must take the same branch.
        return self.dist.any(self.checkpointer is not None and self.checkpointer.due())

    def _log_train(self, read_skips: bool = True) -> None:
        """Read the device's count of skipped updates (one host sync; raises TrainingDiverged), then log.

        A line due by time (`train.log_every_time`) is rank 0's alone (`read_skips=False`): every
        rank reads the skips at the same updates, so that all raise TrainingDiverged together."""
        if read_skips:
            self.state.skipped_updates += self.parts.non_finite.check(self.state.update)
        if self.metrics is not None:
            budget = self.state.train_budget_seconds
            seconds_left = None if budget is None else budget - self.state.train_seconds
            self.metrics.log_train(
                self.state.update, self.state.epoch, self.optimizer.param_groups[0]["lr"], seconds_left
            )
        self._logged_train = True

    # ----------------------------------------------------------------- validation and checkpoints
    def validate_and_save(self, replan: bool = False) -> dict[str, float]:
        """Validate (rank 0), save checkpoints, and share the outcome with every rank. With
        `replan` (a validation during training) the training time under train.max_time is
        planned again from what the validation took.

        A stop signal during the validation stops it: the update is saved without a score
        (as at an update boundary), `stop_signal.requested` is set, and {} is returned."""
        results: dict[str, float] = {}
        self.state.skipped_updates += self.parts.non_finite.check(self.state.update)
        if self.metrics is not None:
            self.metrics.pause()
        self.rhythm.last_seconds = self.state.train_seconds
        wall_start = time.perf_counter()
        if self.dist.is_main:
            self.host_memory.note_peak("training")
            if self.parts.device.type == "cpu":
                release_free_host_memory()  # decoding allocates in other shapes than training
            start = time.perf_counter()
            try:
                with self.stop_signal.interruptible("validation"):
                    results = self.validate()
            except StopRequested:  # what is saved stays; this update is saved as a signal's is
                self.model.train()
                self._save(best=False)
            else:
                self.host_memory.note_peak("validation")
                self.model.train()
                seconds = time.perf_counter() - start
                self.validation_seconds += seconds
                if self.metrics is not None:
                    self.metrics.log_valid(self.state.update, results, seconds)
                self.last_validation = results
                self.budget.note_validation(seconds)
                if replan and self.budget.max_seconds is not None:
                    self.state.train_budget_seconds = self.budget.plan(self.state.train_seconds)
                self._save(best=self.state.record_validation(results))
        # Every rank must agree on the stopping state and the plan; rank 0 owns them.
        self.state.validations_without_gain = int(self.dist.broadcast_from_main(self.state.validations_without_gain))
        if replan and self.budget.max_seconds is not None:
            self.state.train_budget_seconds = self.dist.broadcast_from_main(self.state.train_budget_seconds or 0.0)
        self.budget.note_overhead(time.perf_counter() - wall_start)
        self._after_save()
        if self.metrics is not None:
            self.metrics.resume()
        return results

    def save_without_validation(self) -> None:
        """A checkpoint of this update that does not compete for best.pt (time interval, signal)."""
        self.state.skipped_updates += self.parts.non_finite.check(self.state.update)
        wall_start = time.perf_counter()
        if self.dist.is_main:
            self._save(best=False)
        self.budget.note_overhead(time.perf_counter() - wall_start)
        self._after_save()

    def _save(self, best: bool) -> None:
        if self.checkpointer is not None:
            start = time.perf_counter()
            self.state.wall_seconds = self.budget.wall_seconds()
            self.checkpointer.save(self.checkpoint_state(), self.state.update, best)
            self.budget.note_save(time.perf_counter() - start)

    def _after_save(self) -> None:
        self.dist.barrier()
        self._last_saved_update = self.state.update
        # validation and saving are off the training clock
        self._clock_origin = time.perf_counter() - self.state.train_seconds

    def checkpoint_state(self) -> dict[str, Any]:
        return checkpoint_state.capture(
            self.model, self.optimizer, self.parts.scaler, self.state, self.record, self.parts.ema
        )

    def load_state(self, checkpoint: dict[str, Any]) -> None:
        """Continue from a checkpoint (checked by `checkpointer.check_resumable_*` first)."""
        self.state = checkpoint_state.restore(checkpoint, self.model, self.optimizer, self.parts.scaler, self.parts.ema)
        saved_budget = self.state.train_budget_seconds
        self.state.train_budget_seconds = checkpoint_state.resumed_budget(checkpoint, self.cfg, self.state)
        self._resumed = True
        self._last_saved_update = self.state.update
        self.rhythm.last_seconds = self.state.train_seconds
        log.info(
            "resumed at update %d (epoch %d, batch %d)", self.state.update, self.state.epoch, self.state.batch_in_epoch
        )
        checkpoint_state.warn_of_an_inexact_resume(checkpoint, self.cfg, self.state, saved_budget)

    # ----------------------------------------------------------------- the time budget
    def _start_budget(self) -> None:
        """Before the first update: under train.max_time, measure what follows training (rank 0)
        and plan the training time (a fresh run; a resumed one keeps its plan), then say what
        the budget covers."""
        budget = self.budget
        budget.begin(self.state.train_seconds, self.state.wall_seconds)
        if budget.max_seconds is not None:
            if self.dist.is_main and self.end_cost is not None:
                budget.set_estimate(self.end_cost())
            if not self._resumed or self.state.train_budget_seconds is None:
                planned = budget.plan(self.state.train_seconds) if self.dist.is_main else 0.0
                self.state.train_budget_seconds = self.dist.broadcast_from_main(planned or 0.0)
                if not self._resumed and self.state.train_budget_seconds <= 0.0:
                    raise MtrainError(self._no_time_to_train())
        line = self._budget_line()
        if line:
            log.info("%s", line)

    def _budget_line(self) -> str:
        """What the time budget covers, as the run starts."""
        budget, planned = self.budget, self.state.train_budget_seconds
        if budget.max_seconds is None:
            if budget.max_train_seconds is None:
                return ""
            return (
                f"budget: max_train_time={self.cfg.max_train_time} of training (the learning-rate schedule's "
                "horizon); validations, checkpoints and the test decode come on top (train.max_time caps the "
                "whole run)"
            )
        spent = budget.wall_seconds()
        before = (
            f"{format_duration(spent)} spent before training (start-up, data, model, this estimate)"
            if not self._resumed
            else f"{format_duration(spent)} spent by its earlier sessions and this one's start"
        )
        kept = "nothing measured to keep for what follows"
        if budget.cost is not None:
            kept = f"{format_duration(budget.cost.total)} kept for what follows ({budget.cost.describe()})"
        share = (
            f"{format_duration(planned or 0.0)} of training"
            + (f" ({format_duration(self.state.train_seconds)} done)" if self._resumed else "")
            + " (the learning-rate schedule's horizon"
            + (
                f", capped by max_train_time={self.cfg.max_train_time}"
                if budget_name(self.cfg, planned).startswith("max_train")
                else ""
            )
            + ")"
        )
        return f"budget: max_time={self.cfg.max_time} for the whole run: {before}, {share}, {kept}"

    def _no_time_to_train(self) -> str:
        cost = self.budget.cost
        after = f" and what follows training is estimated at {cost.total:.0f} s ({cost.describe()})" if cost else ""
        return (
            f"train.max_time={self.cfg.max_time}: start-up and data preparation took "
            f"{self.budget.wall_seconds():.0f} s{after}, which leaves no time to train; raise train.max_time, "
            "or leave out the test decode (data.splits.test=null) or shorten validation (train.valid_max_sentences=N)"
        )

    def release_training_memory(self) -> None:
        """Drop the optimiser's moments and the gradients once training is over (the last
        checkpoint holds them), and on a CPU hand the freed memory back to the OS: what stays
        resident through the test decode is the model."""
        self.optimizer.state.clear()
        self.optimizer.zero_grad(set_to_none=True)
        if self.parts.device.type == "cpu":
            release_free_host_memory()

    def summary(self, stop_reason: str | None = None, diverged: bool = False) -> dict[str, Any]:
        """Where training is, for metrics.json (also after TrainingDiverged)."""
        valid = dict(self.last_validation, best_update=self.state.best_update)
        if self.cfg.valid_bleu:
            valid["best_bleu"] = self.state.best_score
        return {
            "updates": self.state.update,
            "epochs": self.state.epoch,
            "train_time_s": round(self.state.train_seconds, 2),
            "train_budget_s": None
            if self.state.train_budget_seconds is None
            else round(self.state.train_budget_seconds, 2),
            "validation_time_s": round(self.validation_seconds, 2),
            "stop_reason": stop_reason,
            "best_update": self.state.best_update,
            "skipped_updates": self.state.skipped_updates,
            "final_train_loss": self.metrics.last_train_loss if self.metrics is not None else float("nan"),
            "valid": valid,
            "diverged": diverged,
            "peak_rss_mb": self.host_memory.note_peak("training"),
            **({"compiled_graphs": self.graphs_built} if self.compiling else {}),
            **self.parts.batches.summary(self.state.epoch),  # several corpora: each one's share of the last epoch
        }
