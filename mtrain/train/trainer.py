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
from mtrain.durations import parse_duration
from mtrain.errors import MtrainError
from mtrain.runtime import release_free_host_memory
from mtrain.train import checkpoint_state
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
    ) -> None:
        """`checkpointer` and `metrics` are rank 0's (None elsewhere); `validate` runs on rank 0;
        `record` is stored in every checkpoint (the config, the data fingerprints); `stop_signal`
        may be installed before the trainer exists (a signal then stops training at its first
        update boundary)."""
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
        self.state = TrainState()
        self.max_seconds = parse_duration(train_cfg.max_time)
        self.rhythm = ValidationRhythm(train_cfg)
        self.last_validation: dict[str, float] = {}
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
        progress = self.state.train_seconds / self.max_seconds if self.max_seconds else 0.0
        lr = self.parts.schedule.lr(self.state.update + 1, progress)
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
                stop_reason = self._stop_reason()
                if stop_reason is None and self._validation_due():
                    self.validate_and_save()
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
        # Ranks agree on the clock: one rank past max_time stops them all.
        out_of_time = self.max_seconds is not None and self.state.train_seconds >= self.max_seconds
        return budget_reason(self.state, self.cfg, self.dist.any(out_of_time))

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

    def _log_train(self) -> None:
        """Read the device's count of skipped updates (one host sync; raises TrainingDiverged), then log."""
        self.state.skipped_updates += self.parts.non_finite.check(self.state.update)
        if self.metrics is not None:
            seconds_left = None if self.max_seconds is None else self.max_seconds - self.state.train_seconds
            self.metrics.log_train(
                self.state.update, self.state.epoch, self.optimizer.param_groups[0]["lr"], seconds_left
            )
        self._logged_train = True

    # ----------------------------------------------------------------- validation and checkpoints
    def validate_and_save(self) -> dict[str, float]:
        """Validate (rank 0), save checkpoints, and share the outcome with every rank.

        A stop signal during the validation stops it: the update is saved without a score
        (as at an update boundary), `stop_signal.requested` is set, and {} is returned."""
        results: dict[str, float] = {}
        self.state.skipped_updates += self.parts.non_finite.check(self.state.update)
        if self.metrics is not None:
            self.metrics.pause()
        self.rhythm.last_seconds = self.state.train_seconds
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
                if self.metrics is not None:
                    self.metrics.log_valid(self.state.update, results, time.perf_counter() - start)
                self.last_validation = results
                self._save(best=self.state.record_validation(results))
        # Every rank must agree on the stopping state; rank 0 owns it.
        self.state.validations_without_gain = int(self.dist.broadcast_from_main(self.state.validations_without_gain))
        self._after_save()
        if self.metrics is not None:
            self.metrics.resume()
        return results

    def save_without_validation(self) -> None:
        """A checkpoint of this update that does not compete for best.pt (time interval, signal)."""
        self.state.skipped_updates += self.parts.non_finite.check(self.state.update)
        if self.dist.is_main:
            self._save(best=False)
        self._after_save()

    def _save(self, best: bool) -> None:
        if self.checkpointer is not None:
            self.checkpointer.save(self.checkpoint_state(), self.state.update, best)

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
        self._last_saved_update = self.state.update
        self.rhythm.last_seconds = self.state.train_seconds
        log.info(
            "resumed at update %d (epoch %d, batch %d)", self.state.update, self.state.epoch, self.state.batch_in_epoch
        )
        checkpoint_state.warn_of_an_inexact_resume(checkpoint, self.cfg, self.state)

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
