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

from mtrain.config import TrainConfig
from mtrain.runtime import release_free_host_memory
from mtrain.train import checkpoint_state
from mtrain.train.agreement import NO_AGREEMENT, Agreement, Ballot
from mtrain.train.budget import EndCost, RunBudget, configured_training_budget
from mtrain.train.budget_keeper import BudgetKeeper
from mtrain.train.builders import TrainingParts
from mtrain.train.checkpointer import Checkpointer
from mtrain.train.compilation import GraphLog, compiling
from mtrain.train.distributed import DistributedContext
from mtrain.train.faults import StopRequested, StopSignal
from mtrain.train.host_memory import HostMemory
from mtrain.train.instrument_log import InstrumentLog
from mtrain.train.metric_log import MetricLogger
from mtrain.train.progress import TrainingProgress, TrainState, ValidationRhythm, training_progress
from mtrain.train.step import UpdateStep

log = logging.getLogger("mtrain")

Validate = Callable[[], dict[str, float]]  # {loss, ppl, ...; bleu when measured}


def no_validation() -> dict[str, float]:
    """The `validate` of benchmarks, which time updates and never validate."""
    raise RuntimeError("this trainer was built without validation (a benchmark)")


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
        `end_cost` measures what follows training: both go to the `BudgetKeeper`, which says
        when training stops."""
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
        self.budget = BudgetKeeper(train_cfg, dist, budget or RunBudget(train_cfg, time.monotonic()), end_cost)
        self._resumed = False
        self.update_seconds = 0.0  # the last update's training time: the next one's, as the budget reads it
        self.rhythm = ValidationRhythm(train_cfg)
        self.agreement = Agreement(dist)  # when the ranks settle stopping, validating and saving by time
        self.last_validation: dict[str, float] = {}
        self.validation_seconds = 0.0  # this session's, all validations
        self._clock_origin: float | None = None  # perf_counter() at train_seconds == 0
        self._session_start = (0, 0.0)  # (update, train_seconds) as this process's training began
        self._last_saved_update = -1
        self._logged_train = False
        self.exhausted = False  # max_epochs done: `run_update` found no more batches
        self.graphs = GraphLog() if compiling(train_cfg) else None  # torch.compile's

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
        stats = self.step.or_skip(batches, self.state.update + 1, self.cfg.max_tokens)
        if self.graphs is not None:
            self.graphs.after_update(self.state.update + 1, batches[0], time.perf_counter() - step_start)
        self.state.train_seconds = time.perf_counter() - self._clock_origin
        self.update_seconds = self.state.train_seconds - before
        if stats is None:
            return None
        # A non-finite update counts (its step was skipped on the device); the skips are read,
        # and divergence detected, at log intervals and before checkpoints.
        self.state.update += 1
        self.host_memory.after_update(self.state.update)
        if self.metrics is not None:
            self.metrics.update(stats, self.state.update)
        return stats

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
        self.budget.start(self.state, self._resumed)
        if self.dist.enabled and self.dist.is_main:
            log.info("%s", self.dist.describe(self.budget.run.cost))
        self._clock_origin = time.perf_counter() - self.state.train_seconds
        self._session_start = (self.state.update, self.state.train_seconds)
        stop_reason = self._stop_reason(self._agree())  # a resumed run may already be done
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
                agreed = self._agree()
                stop_reason = self._stop_reason(agreed)
                if stop_reason is None and (self.rhythm.by_updates(self.state) or agreed.validate):
                    self.validate_and_save(replan=True)
                    stop_reason = self._signal_stop()
                elif stop_reason is None and agreed.save:
                    self.save_without_validation()
                elif stop_reason is None and self.budget.measure_due:
                    self._measure_end_cost()
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
                where = f"at update {self.state.update}; checkpoint written, continue with train.resume=true"
                raise self.stop_signal.interrupted(where)
        finally:
            if self._owns_stop_signal:
                self.stop_signal.uninstall()
        log.info("training stopped: %s (update %d, %.0f s)", stop_reason, self.state.update, self.state.train_seconds)
        return self.summary(stop_reason)

    def _agree(self) -> Ballot:
        """What the ranks decide together after this update: a stop signal, the time budget,
        validation and saving due by time (`NO_AGREEMENT` between agreements, which under DDP
        come every few seconds, each one collective: mtrain.train.agreement)."""
        if not self.agreement.due(self.state.update):
            return NO_AGREEMENT
        ahead = self.agreement.updates_ahead(self.update_seconds, self.budget.seconds_to_deadline(self.state))
        out_of_time, measure = self.budget.vote(self.state, self.update_seconds, ahead)
        ballot = Ballot(
            stop_signal=self.stop_signal.requested,
            out_of_time=out_of_time,
            measure=measure,
            validate=self.rhythm.by_time(self.state),
            # rank 0 owns the clock of saves
            save=self.cfg.save_every is not None and self.checkpointer is not None and self.checkpointer.due(),
        )
        return self.agreement.agree(ballot, self.state.update, ahead)

    def _stop_reason(self, agreed: Ballot) -> str | None:
        if agreed.stop_signal:
            return "stop signal"
        return self.budget.stop_reason(self.state, self.update_seconds, agreed)

    def _signal_stop(self) -> str | None:  # a signal during a validation, on any rank
        return "stop signal" if self.dist.any(self.stop_signal.requested) else None

    def _log_train(self, read_skips: bool = True) -> None:
        """Read the device's count of skipped updates (one host sync; raises TrainingDiverged), then log.

        A line due by time (`train.log_every_time`) is rank 0's alone (`read_skips=False`): every
        rank reads the skips at the same updates, so that all raise TrainingDiverged together."""
        if read_skips:
            self.state.skipped_updates += self.parts.non_finite.check(self.state.update)
        if self.metrics is not None:
            lr = self.optimizer.param_groups[0]["lr"]
            self.metrics.log_train(self.state.update, self.state.epoch, lr, self.progress())
        self._logged_train = True

    def progress(self) -> TrainingProgress:
        """How far training is against its budgets, the updates left timed at this session's pace."""
        start_update, start_seconds = self._session_start
        done = self.state.update - start_update
        seconds_per_update = (self.state.train_seconds - start_seconds) / done if done > 0 else None
        return training_progress(self.state, self.cfg.max_updates, seconds_per_update)

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
                self.budget.after_validation(self.state, seconds, replan)  # the plan, saved with the checkpoint
                self._save(best=self.state.record_validation(results))
        # Every rank must agree on the stopping state and the plan; rank 0 owns them.
        self.state.validations_without_gain = int(self.dist.broadcast_from_main(self.state.validations_without_gain))
        self.budget.after_pause(self.state, time.perf_counter() - wall_start, replan)
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
        self.budget.after_pause(self.state, time.perf_counter() - wall_start, replan=False)
        self._after_save()

    def _save(self, best: bool) -> None:
        if self.checkpointer is not None:
            start = time.perf_counter()
            self.state.wall_seconds = self.budget.run.wall_seconds()
            self.checkpointer.save(self.checkpoint_state(), self.state.update, best)
            self.budget.after_save(time.perf_counter() - start)

    def _after_save(self) -> None:
        self._off_the_clock()
        self._last_saved_update = self.state.update

    def _measure_end_cost(self) -> None:
        """What follows training, measured again on the machine as it is now (not in the throughput)."""
        if self.metrics is not None:
            self.metrics.pause()
        self.budget.measure(self.state)
        self._off_the_clock()
        if self.metrics is not None:
            self.metrics.resume()

    def _off_the_clock(self) -> None:
        """Validation, saving and measuring are off the training clock (every rank waits for rank 0)."""
        self.dist.barrier()
        self._clock_origin = time.perf_counter() - self.state.train_seconds

    def checkpoint_state(self) -> dict[str, Any]:
        if self.metrics is not None:
            self.state.loss_point = self.metrics.curve.open_point()
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
        if self.metrics is not None:
            self.metrics.curve.restore(self.state.loss_point)
        log.info(
            "resumed at update %d (epoch %d, batch %d)", self.state.update, self.state.epoch, self.state.batch_in_epoch
        )
        checkpoint_state.warn_of_an_inexact_resume(checkpoint, self.cfg, self.state, saved_budget)

    @property
    def graphs_built(self) -> int:
        """The graphs torch.compile built for this trainer (0 when it does not compile)."""
        return self.graphs.built if self.graphs is not None else 0

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
            **self.budget.summary(self.state),  # the training time planned; the machine's share
            "validation_time_s": round(self.validation_seconds, 2),
            "stop_reason": stop_reason,
            "best_update": self.state.best_update,
            "skipped_updates": self.state.skipped_updates,
            "final_train_loss": self.metrics.last_train_loss if self.metrics is not None else float("nan"),
            "valid": valid,
            "diverged": diverged,
            "peak_rss_mb": self.host_memory.note_peak("training"),
            **({"compiled_graphs": self.graphs.built} if self.graphs is not None else {}),
            **self.parts.batches.summary(self.state.epoch),  # several corpora: each one's share of the last epoch
        }
