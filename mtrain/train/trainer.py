"""The training loop: batches in, updates out, with validation and checkpoints between.

One update (`train_step`) = forward and backward over `update_freq` batches, the loss
normalised by the update's target tokens (on all ranks), gradient clipping, one optimiser
step. `fit` decides when to log, validate, save and stop; what validation measures is
given to the trainer as a callable (built by `mtrain fit`), where checkpoints go is the
`Checkpointer`'s business, and what is reported is the `MetricLogger`'s.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from omegaconf import DictConfig
from torch.nn.parallel import DistributedDataParallel

from mtrain.config import to_plain
from mtrain.batches import Batch, EncodedCorpus, TokenBatchSampler, collate
from mtrain.errors import MtrainError
from mtrain.train.checkpointing import Checkpointer
from mtrain.model import StatisticsRecorder
from mtrain.train.distributed import DistributedContext
from mtrain.train.faults import NonFiniteGuard, OutOfMemoryGuard, StopSignal, is_out_of_memory
from mtrain.train.loss import TranslationLoss
from mtrain.train.metric_log import MetricLogger
from mtrain.train.prefetch import BatchPrefetcher
from mtrain.runtime import peak_host_memory_mb, release_free_host_memory
from mtrain.train.runtime import autocast, rng_state, set_rng_state
from mtrain.durations import parse_duration
from mtrain.train.schedule import LearningRateSchedule

log = logging.getLogger("mtrain")

Validate = Callable[[], Dict[str, float]]  # {loss, ppl, ...; bleu when measured}


# Updates between returns of freed host memory to the OS on a CPU run (`release_free_host_memory`):
# every update costs speed, every 10 does not (docs/PERFORMANCE.md).
HOST_MEMORY_TRIM_EVERY = 10


def no_validation() -> Dict[str, float]:
    """The `validate` of benchmarks, which time updates and never validate."""
    raise RuntimeError("this trainer was built without validation (a benchmark)")


def special_ids(data: Any) -> Dict[str, int]:
    """pad, bos and eos ids of a PreparedData's tokenizer, as the trainer takes them."""
    tokenizer = data.tokenizer
    return {"pad": tokenizer.pad_id, "bos": tokenizer.bos_id, "eos": tokenizer.eos_id}


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


def batch_pad_multiple(configured: Optional[int], device: torch.device, precision: str) -> int:
    """`train.pad_to_multiple`, with null resolved per device and precision (see its comment)."""
    if configured is not None:  # config_checks has made sure it is >= 1
        return configured
    if device.type == "cuda":
        return 8
    return 4 if precision == "bf16" else 1


def budget_reason(state: TrainState, train_cfg: Any, out_of_time: Optional[bool] = None) -> Optional[str]:
    """Why training at `state` is done under `train_cfg`'s budget and patience (None: not done).

    `out_of_time` overrides the max_time test (ranks agree on it); by default it is
    computed from `state.train_seconds`.
    """
    if train_cfg.max_updates is not None and state.update >= train_cfg.max_updates:
        return f"max_updates={train_cfg.max_updates} reached"
    if out_of_time is None:
        max_seconds = parse_duration(train_cfg.max_time)
        out_of_time = max_seconds is not None and state.train_seconds >= max_seconds
    if out_of_time:
        return f"max_time={train_cfg.max_time} reached"
    if train_cfg.patience is not None and state.validations_without_gain >= train_cfg.patience:
        return f"no val-BLEU gain in {train_cfg.patience} validations (patience)"
    return None


class TrainingInterrupted(MtrainError):
    """A stop signal ended training after a checkpoint was written; exit with `exit_status`."""

    def __init__(self, message: str, exit_status: int) -> None:
        super().__init__(message)
        self.exit_status = exit_status


class Trainer:
    def __init__(
        self,
        cfg: DictConfig,
        model: torch.nn.Module,
        train_corpus: EncodedCorpus,
        special_ids: Dict[str, int],
        device: torch.device,
        precision: str,
        dist: DistributedContext,
        validate: Validate,
        checkpointer: Optional[Checkpointer] = None,
        metrics: Optional[MetricLogger] = None,
        checkpoint_extras: Optional[Dict[str, Any]] = None,
        stop_signal: Optional[StopSignal] = None,
        prefetch: Optional[bool] = None,
        epoch_corpora: Sequence[EncodedCorpus] = (),
    ) -> None:
        """`checkpointer` and `metrics` are rank 0's (None elsewhere); `validate` runs on rank 0;
        `checkpoint_extras` are stored in every checkpoint (e.g. the data fingerprints);
        `stop_signal` may be installed before the trainer exists (a signal then stops training
        at its first update boundary); `prefetch` (default: on CUDA) collates the next batches
        in a background thread; `epoch_corpora` (subword sampling: segmentations of
        `train_corpus`), when given, are what epoch e trains on, epoch_corpora[(e - 1) % len]."""
        self.cfg = cfg
        self.train_cfg = cfg.train
        self.model = model  # the bare module: checkpoints, validation, statistics
        self.train_corpus = train_corpus
        self.epoch_corpora: List[EncodedCorpus] = list(epoch_corpora) or [train_corpus]
        self.special_ids = special_ids
        self.device = device
        self.precision = precision
        self.dist = dist
        self.validate = validate
        self.checkpointer = checkpointer
        self.metrics = metrics
        self.checkpoint_extras = checkpoint_extras or {}

        # What the train step calls: the model and its loss as one module (DDP / compiled).
        self.network: torch.nn.Module = TranslationLoss(model, special_ids["pad"], self.train_cfg.label_smoothing)
        if dist.enabled:
            self.network = DistributedDataParallel(
                self.network, device_ids=[device.index] if device.type == "cuda" else None
            )
        if self.train_cfg.compile:
            self.network = torch.compile(self.network, dynamic=True)

        self.optimizer = torch.optim.AdamW(
            model.parameters(),
            lr=self.train_cfg.lr,
            betas=tuple(self.train_cfg.betas),
            eps=self.train_cfg.eps,
            weight_decay=self.train_cfg.weight_decay,
            # one kernel per parameter instead of ~6 (CPU too: +2% per fp32 update, docs/PERFORMANCE.md)
            fused=device.type in ("cpu", "cuda") or None,
        )
        self.schedule = LearningRateSchedule(self.train_cfg)
        self.scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
        self.pad_to_multiple = batch_pad_multiple(self.train_cfg.pad_to_multiple, device, precision)
        # one sampler per segmentation: each cuts its batches from its own lengths
        self.samplers = [
            TokenBatchSampler(
                corpus.src_lengths,
                corpus.tgt_lengths,
                max_tokens=self.train_cfg.max_tokens,
                seed=cfg.seed,
                shuffle=True,
                num_replicas=dist.world_size,
                rank=dist.rank,
                pad_to_multiple=self.pad_to_multiple,
            )
            for corpus in self.epoch_corpora
        ]
        self.state = TrainState()
        self.max_seconds = parse_duration(self.train_cfg.max_time)
        self.validate_every_seconds = parse_duration(self.train_cfg.validate_every_time, "train.validate_every_time")
        self._last_validation_seconds = 0.0
        self._logged_train = False
        self.stop_signal = stop_signal or StopSignal()
        self._owns_stop_signal = stop_signal is None  # else its owner uninstalls it
        self.non_finite = NonFiniteGuard(self.train_cfg.max_bad_updates, device)
        self.out_of_memory = OutOfMemoryGuard(self.train_cfg.max_oom_batches)
        self.last_validation: Dict[str, float] = {}
        self._epoch_batches: Optional[List[np.ndarray]] = None
        # On a GPU the next update's batches are collated in a background thread; on a CPU
        # that thread would take cores from the update itself.
        use_prefetch = device.type == "cuda" if prefetch is None else prefetch
        self._prefetcher = BatchPrefetcher(self._host_batch, self.train_cfg.update_freq) if use_prefetch else None
        self._last_saved_update = -1
        self._instrumenting = False
        self._statistics = StatisticsRecorder(model)
        self.host_memory_trim_every = HOST_MEMORY_TRIM_EVERY if device.type == "cpu" else 0
        self.peak_host_memory: Dict[str, int] = {}  # MB per phase (`_note_peak_host_memory`)

    # ----------------------------------------------------------------- the update
    def train_step(self, batches: List[Batch]) -> Dict[str, Any]:
        """One optimiser update over `batches` (gradient accumulation); returns tensors, not floats.

        Nothing in it waits for the device: losses, the gradient norm and the non-finite flag
        stay tensors until a log interval reads them."""
        self.network.train()
        self.optimizer.zero_grad(set_to_none=True)
        local_tokens = sum(batch.num_tgt_tokens for batch in batches)
        local_src_tokens = sum(batch.num_src_tokens for batch in batches)
        # DDP averages gradients over ranks; scaling by world/global tokens makes the
        # result the gradient of the per-token mean over the whole update, as one process would.
        # (The source count rides along in the same collective: the log's tokens/s are the job's.)
        global_tokens, global_src_tokens = self.dist.sum_each([float(local_tokens), float(local_src_tokens)])
        scale = self.dist.world_size / max(global_tokens, 1.0)
        loss_sum = torch.zeros((), device=self.device)
        nll_sum = torch.zeros((), device=self.device)
        for index, batch in enumerate(batches):
            last = index == len(batches) - 1
            sync = contextlib.nullcontext() if last or not self.dist.enabled else self.network.no_sync()
            with sync:
                loss, nll = self.forward_loss(batch)
                self.scaler.scale(loss * scale).backward()
            loss_sum += loss.detach()
            nll_sum += nll
        self.scaler.unscale_(self.optimizer)
        if self._instrumenting:
            self._log_instruments()
        clip = self.train_cfg.clip_norm if self.train_cfg.clip_norm > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip).detach()
        # A non-finite step must be skipped, not applied; the test stays on the device.
        skipped = torch.logical_not(torch.isfinite(grad_norm) & torch.isfinite(loss_sum))
        if self.precision == "fp16":
            self.scaler.step(self.optimizer)  # the scaler skips overflowing steps itself
            self.scaler.update()
            skipped = torch.zeros_like(skipped)  # and an overflow is not a fault
        else:
            self._step_unless(skipped)
        # Gradients are rebuilt by the next backward: validation and checkpoints run without them.
        self.optimizer.zero_grad(set_to_none=True)
        self.non_finite.record(skipped)
        good = torch.logical_not(skipped)
        return {
            # a skipped update's NaN must not reach the logged averages
            "loss_sum": torch.where(good, loss_sum, 0.0),
            "nll_sum": torch.where(good, nll_sum, 0.0),
            "grad_norm": torch.where(good, grad_norm, 0.0),
            "skipped": skipped,
            "tgt_tokens": local_tokens,
            "src_tokens": local_src_tokens,
            "job_tgt_tokens": int(global_tokens),  # all ranks' (= the local counts in one process)
            "job_src_tokens": int(global_src_tokens),
            "sentences": sum(batch.src_tokens.size(0) for batch in batches),
        }

    def _step_unless(self, skipped: torch.Tensor) -> None:
        """optimizer.step(), skipped on the device when `skipped` is True.

        The fused AdamW (CPU and CUDA) takes a `found_inf` flag, as it does from GradScaler:
        it leaves weights and moments untouched and takes the step count back, with no host
        synchronisation. Another optimizer implementation reads the flag on the host.
        """
        if self.optimizer.defaults.get("fused"):
            self.optimizer.found_inf = skipped.to(torch.float32)
            try:
                self.optimizer.step()
            finally:
                del self.optimizer.found_inf
        elif not bool(skipped):
            self.optimizer.step()

    def forward_loss(self, batch: Batch):
        """Summed label-smoothed loss and NLL of one batch (a seam for fault-injection tests)."""
        with autocast(self.device, self.precision):
            return self.network(batch.src_tokens, batch.src_padding_mask, batch.tgt_input, batch.tgt_output,
                                batch.num_tgt_tokens)

    def next_batches(self) -> Optional[List[Batch]]:
        """The next `update_freq` batches of this rank, crossing epoch boundaries as needed;
        None once `train.max_epochs` is done."""
        batches: List[Batch] = []
        while len(batches) < self.train_cfg.update_freq:
            if self._epoch_batches is None:
                self._epoch_batches = self._batches_of_epoch(self.state.epoch)
            if self.state.batch_in_epoch >= len(self._epoch_batches):
                if batches:  # finish the update with what the epoch had left
                    break
                if self.train_cfg.max_epochs is not None and self.state.epoch >= self.train_cfg.max_epochs:
                    return None
                self.state.epoch += 1
                self.state.batch_in_epoch = 0
                self._epoch_batches = self._batches_of_epoch(self.state.epoch)
                continue
            position = self.state.batch_in_epoch
            indices = self._epoch_batches[position]
            self.state.batch_in_epoch += 1
            if self._prefetcher is None:
                batch = self._host_batch((self.state.epoch, position), indices)
            else:  # this update's batches were collated while the device ran the previous one
                ahead = range(position + 1, min(position + 1 + self.train_cfg.update_freq, len(self._epoch_batches)))
                batch = self._prefetcher.get(
                    (self.state.epoch, position), indices,
                    (((self.state.epoch, p), self._epoch_batches[p]) for p in ahead))
            batches.append(batch.to(self.device, non_blocking=True))
        return batches

    def _segmentation(self, epoch: int) -> int:
        """Which of `epoch_corpora` epoch `epoch` (1-based) trains on."""
        return (epoch - 1) % len(self.epoch_corpora)

    def _batches_of_epoch(self, epoch: int) -> List[np.ndarray]:
        return self.samplers[self._segmentation(epoch)].batches(epoch)

    def _host_batch(self, key: Tuple[int, int], indices: np.ndarray) -> Batch:
        """The collated batch of `indices` of batch `key` = (epoch, position), in pinned memory on
        a GPU (the copy then overlaps compute). The epoch names the corpus: the prefetcher may
        still collate an epoch's last batches when the trainer has moved to the next."""
        ids = self.special_ids
        corpus = self.epoch_corpora[self._segmentation(key[0])]
        batch = collate(corpus, indices, ids["pad"], ids["bos"], ids["eos"], self.pad_to_multiple)
        return batch.pin_memory() if self.device.type == "cuda" else batch

    def set_learning_rate(self) -> float:
        """Set (and return) the learning rate of the next update."""
        progress = self.state.train_seconds / self.max_seconds if self.max_seconds else 0.0
        lr = self.schedule.lr(self.state.update + 1, progress)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    # ----------------------------------------------------------------- the loop
    def fit(self) -> Dict[str, Any]:
        """Train until a stop condition; returns the training summary for metrics.json.

        A stop signal writes a checkpoint (no validation) and raises TrainingInterrupted;
        the signal handlers stay installed until then, so a second signal is handled too.
        """
        cfg = self.train_cfg
        self._log_start()
        self.stop_signal.install()
        loop_start = time.perf_counter() - self.state.train_seconds
        stop_reason = self._stop_reason()  # a resumed run may already be done
        try:
            while stop_reason is None:
                batches = self.next_batches()
                if batches is None:
                    stop_reason = f"max_epochs={cfg.max_epochs} reached"
                    break
                self.set_learning_rate()
                self._instrumenting = cfg.instruments and (self.state.update + 1) % cfg.instrument_every == 0
                if self._instrumenting:
                    self._statistics.arm()
                step_start = time.perf_counter()
                stats = self._guarded_step(batches)
                self.state.train_seconds = time.perf_counter() - loop_start
                if cfg.compile and not self._logged_train:  # the first update compiles the model
                    log.info("torch.compile: the first update took %.1f s (tracing and code generation; "
                             "variable shapes are compiled once, as dynamic)", time.perf_counter() - step_start)
                if stats is None:  # out of memory: batch skipped
                    continue
                # A non-finite update counts (its step was skipped on the device); the skips
                # are read, and divergence detected, at log intervals and before checkpoints.
                self.state.update += 1
                self.release_host_memory_if_due()
                if self.metrics is not None:
                    self.metrics.update(stats)
                # The first update of a process is logged too: progress shows at once.
                if self.state.update % cfg.log_every == 0 or not self._logged_train:
                    self._check_non_finite()
                    if self.metrics is not None:
                        self.metrics.log_train(self.state.update, self.state.epoch, self._current_lr(), self._seconds_left())
                    self._logged_train = True
                stop_reason = self._stop_reason()
                if stop_reason is None and self._validation_due():
                    self.validate_and_save()
                    loop_start = time.perf_counter() - self.state.train_seconds
                elif stop_reason is None and self._save_due():
                    self.save_without_validation()
                    loop_start = time.perf_counter() - self.state.train_seconds
            self._check_non_finite()
            if self.metrics is not None:
                self.metrics.log_train(self.state.update, self.state.epoch, self._current_lr(), self._seconds_left())
            if stop_reason == "stop signal":
                self.save_without_validation()
                log.info("training stopped: stop signal (update %d, %.0f s)", self.state.update,
                         self.state.train_seconds)
                raise TrainingInterrupted(
                    f"stopped by {self.stop_signal.name} at update {self.state.update}; checkpoint written, "
                    "continue with train.resume=true", 128 + self.stop_signal.signum)
            if self._last_saved_update != self.state.update:
                self.validate_and_save()
        finally:
            if self._owns_stop_signal:
                self.stop_signal.uninstall()
        log.info("training stopped: %s (update %d, %.0f s)", stop_reason, self.state.update, self.state.train_seconds)
        return self.summary(stop_reason)

    def release_host_memory_if_due(self) -> None:
        """After an update: every `host_memory_trim_every` updates (CPU runs), hand the
        activations' freed blocks back to the OS."""
        if self.host_memory_trim_every and self.state.update % self.host_memory_trim_every == 0:
            release_free_host_memory()

    def release_training_memory(self) -> None:
        """Drop the optimiser's moments and the gradients once training is over (the last
        checkpoint holds them), and on a CPU hand the freed memory back to the OS: what stays
        resident through the test decode is the model."""
        self.optimizer.state.clear()
        self.optimizer.zero_grad(set_to_none=True)
        if self.device.type == "cpu":
            release_free_host_memory()

    def summary(self, stop_reason: Optional[str] = None, diverged: bool = False) -> Dict[str, Any]:
        """Where training is, for metrics.json (also after TrainingDiverged)."""
        valid = dict(self.last_validation, best_update=self.state.best_update)
        if self.train_cfg.valid_bleu:
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
            "peak_rss_mb": self._note_peak_host_memory("training"),
        }

    def _note_peak_host_memory(self, phase: str) -> Dict[str, int]:
        """Fold the process's peak resident memory since the last note into `phase`'s (training
        or validation) and start a new peak; returns the peaks so far (empty where unknown)."""
        peak = peak_host_memory_mb(reset=True)
        if peak is not None:
            self.peak_host_memory[phase] = max(self.peak_host_memory.get(phase, 0), round(peak))
        return dict(self.peak_host_memory)

    def _check_non_finite(self) -> None:
        """Read the device's count of skipped updates (one host sync); raises TrainingDiverged."""
        self.state.skipped_updates += self.non_finite.check(self.state.update)

    def _guarded_step(self, batches: List[Batch]) -> Optional[Dict[str, Any]]:
        try:
            stats = self.train_step(batches)
        except Exception as error:  # noqa: BLE001 - only out-of-memory is handled here
            if not is_out_of_memory(error):
                raise
            self.optimizer.zero_grad(set_to_none=True)
            shape = "x".join(str(s) for s in batches[0].tgt_input.shape)
            self.out_of_memory.record_failure(shape, self.train_cfg.max_tokens)
            return None
        self.out_of_memory.record_success()
        return stats

    def _seconds_left(self) -> Optional[float]:
        return None if self.max_seconds is None else self.max_seconds - self.state.train_seconds

    def _current_lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def _validation_due(self) -> bool:
        """Every `validate_every` updates, and every `validate_every_time` of training time
        (measured on the saved training clock, so a resumed run keeps the same rhythm)."""
        if self.state.update % self.train_cfg.validate_every == 0:
            return True
        if self.validate_every_seconds is None:
            return False
        due = self.state.train_seconds >= self._last_validation_seconds + self.validate_every_seconds
        return self.dist.any(due)

    def _save_due(self) -> bool:
        if self.train_cfg.save_every is None:
            return False  # no collective per update when there is no interval to check
        # Rank 0 owns the clock of saves; every rank must take the same branch.
        return self.dist.any(self.checkpointer is not None and self.checkpointer.due())

    def _stop_reason(self) -> Optional[str]:
        if self.dist.any(self.stop_signal.requested):
            return "stop signal"
        # Ranks agree on the clock: one rank past max_time stops them all.
        return budget_reason(self.state, self.train_cfg, self.dist.any(self._out_of_time()))

    def _out_of_time(self) -> bool:
        return self.max_seconds is not None and self.state.train_seconds >= self.max_seconds

    # ----------------------------------------------------------------- validation and checkpoints
    def validate_and_save(self) -> Dict[str, float]:
        """Validate (rank 0), save checkpoints, and share the outcome with every rank."""
        results: Dict[str, float] = {}
        self._check_non_finite()
        if self.metrics is not None:
            self.metrics.pause()
        self._last_validation_seconds = self.state.train_seconds
        if self.dist.is_main:
            self._note_peak_host_memory("training")
            if self.device.type == "cpu":
                release_free_host_memory()  # decoding allocates in other shapes than training
            start = time.perf_counter()
            results = self.validate()
            self._note_peak_host_memory("validation")
            self.model.train()
            if self.metrics is not None:
                self.metrics.log_valid(self.state.update, results, time.perf_counter() - start)
            self.last_validation = results
            score = results["bleu"] if "bleu" in results else -results["loss"]
            improved = score > self.state.best_score
            if improved:
                self.state.best_score = score
                self.state.best_update = self.state.update
                self.state.validations_without_gain = 0
            else:
                self.state.validations_without_gain += 1
            self._save(best=improved)
        # Every rank must agree on the stopping state; rank 0 owns it.
        self.state.validations_without_gain = int(self.dist.broadcast_from_main(self.state.validations_without_gain))
        self.dist.barrier()
        self._last_saved_update = self.state.update
        if self.metrics is not None:
            self.metrics.resume()
        return results

    def save_without_validation(self) -> None:
        """A checkpoint of this update that does not compete for best.pt (time interval, signal)."""
        self._check_non_finite()
        if self.dist.is_main:
            self._save(best=False)
        self.dist.barrier()
        self._last_saved_update = self.state.update

    def _save(self, best: bool) -> None:
        if self.checkpointer is not None:
            self.checkpointer.save(self.checkpoint_state(), self.state.update, best)

    def checkpoint_state(self) -> Dict[str, Any]:
        from mtrain import __version__

        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "rng": rng_state(),
            "trainer": asdict(self.state),
            "update": self.state.update,
            "config": to_plain(self.cfg),
            "mtrain_version": __version__,
            **self.checkpoint_extras,
        }

    def load_state(self, state: Dict[str, Any]) -> None:
        """Continue from a checkpoint's state (checked by `checkpointing.check_resumable` first)."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scaler.load_state_dict(state["scaler"])
        self.state = TrainState(**state["trainer"])
        set_rng_state(state["rng"])
        self._last_saved_update = self.state.update
        self._last_validation_seconds = self.state.train_seconds
        log.info("resumed at update %d (epoch %d, batch %d)", self.state.update, self.state.epoch,
                 self.state.batch_in_epoch)

    # ----------------------------------------------------------------- logging
    def _log_start(self) -> None:
        params = sum(p.numel() for p in self.model.parameters())
        tokens_per_update = self.train_cfg.max_tokens * self.train_cfg.update_freq * self.dist.world_size
        log.info(
            "model: %.2fM parameters | device %s | precision %s | %d rank(s) | batch budget %d tokens/update "
            "(max_tokens %d x update_freq %d x ranks %d) | lengths padded to multiples of %d | %d training pairs",
            params / 1e6, self.device, self.precision, self.dist.world_size, tokens_per_update,
            self.train_cfg.max_tokens, self.train_cfg.update_freq, self.dist.world_size, self.pad_to_multiple,
            len(self.train_corpus),
        )

    def _log_instruments(self) -> None:
        """Per-group gradient norms and the activation statistics of this update's forward."""
        values: Dict[str, Optional[float]] = {}
        for name, parameters in self.model.gradient_norm_groups().items():
            grads = [p.grad for p in parameters if p.grad is not None]
            values[f"grad_norm/{name}"] = (
                float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
                if grads else 0.0
            )
        for name, value in self._statistics.statistics.items():
            values[f"activations/{name}"] = value
        self._statistics.disarm()
        if self.metrics is not None:
            self.metrics.scalars("instruments", values, self.state.update + 1)
