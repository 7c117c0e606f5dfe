"""The training loop: batches in, updates out, with validation and checkpoints between.

One update (`train_step`) = forward and backward over `update_freq` batches, the loss
normalised by the update's target tokens (on all ranks), gradient clipping, one optimiser
step. Everything else here decides when to log, validate, save and stop.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import sacrebleu
import torch
from omegaconf import DictConfig, OmegaConf
from torch.nn.parallel import DistributedDataParallel

from mtrain.data import Batch, PreparedData, TokenBatchSampler, collate
from mtrain.errors import MtrainError
from mtrain.train.checkpoint import CHECKPOINT_DIR, load_checkpoint, save_checkpoint, update_checkpoints
from mtrain.train.distributed import DistributedContext
from mtrain.train.faults import NonFiniteGuard, OutOfMemoryGuard, StopSignal, is_out_of_memory
from mtrain.train.loss import sequence_loss
from mtrain.train.runtime import autocast, rng_state, set_rng_state
from mtrain.train.schedule import LearningRateSchedule, parse_duration
from mtrain.train.throughput import model_flops_utilization, peak_flops

log = logging.getLogger("mtrain")


@dataclass
class TrainState:
    """Where training is: everything besides tensors that a resumed run must restore."""

    update: int = 0
    epoch: int = 1
    batch_in_epoch: int = 0  # this rank's batches of `epoch` already consumed
    train_seconds: float = 0.0  # wall time of training updates (periodic validation excluded)
    best_score: float = float("-inf")  # val BLEU, or minus val loss when valid_bleu is off
    best_update: int = 0
    validations_without_gain: int = 0
    skipped_updates: int = 0


class Trainer:
    def __init__(
        self,
        cfg: DictConfig,
        run_dir: Path,
        data: PreparedData,
        model: torch.nn.Module,
        device: torch.device,
        precision: str,
        dist: DistributedContext,
    ) -> None:
        self.cfg = cfg
        self.train_cfg = cfg.train
        self.run_dir = run_dir
        self.data = data
        self.model = model  # the bare module: checkpoints, validation, statistics
        self.device = device
        self.precision = precision
        self.dist = dist
        self.tokenizer = data.tokenizer
        self.pad_id = data.tokenizer.pad_id

        self.network: torch.nn.Module = model  # what the train step calls (DDP / compiled)
        if dist.enabled:
            self.network = DistributedDataParallel(
                model, device_ids=[device.index] if device.type == "cuda" else None
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
        self.sampler = TokenBatchSampler(
            data.train.src_lengths,
            data.train.tgt_lengths,
            max_tokens=self.train_cfg.max_tokens,
            seed=cfg.seed,
            shuffle=True,
            num_replicas=dist.world_size,
            rank=dist.rank,
            pad_to_multiple=self.train_cfg.pad_to_multiple,
        )
        self.state = TrainState()
        self.max_seconds = parse_duration(self.train_cfg.max_time)
        self.stop_signal = StopSignal()
        self.non_finite = NonFiniteGuard(self.train_cfg.max_bad_updates)
        self.out_of_memory = OutOfMemoryGuard(self.train_cfg.max_oom_batches)
        self.peak_flops = peak_flops(device, precision)
        self.writer = None
        if dist.is_main:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(run_dir / "tb"))
        self._epoch_batches: Optional[List[np.ndarray]] = None
        self._last_saved_update = -1
        self._instrumenting = False
        self.last_validation: Dict[str, float] = {}
        self.final_train_loss = float("nan")

    # ----------------------------------------------------------------- the update
    def train_step(self, batches: List[Batch]) -> Dict[str, Any]:
        """One optimiser update over `batches` (gradient accumulation); returns tensors, not floats."""
        self.network.train()
        self.optimizer.zero_grad(set_to_none=True)
        local_tokens = sum(batch.num_tgt_tokens for batch in batches)
        # DDP averages gradients over ranks; scaling by world/global tokens makes the
        # result the gradient of the per-token mean over the whole update, as one process would.
        global_tokens = self.dist.sum(float(local_tokens))
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
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        # One host sync per update: a non-finite step must be skipped, not applied.
        finite = bool(torch.isfinite(grad_norm)) and bool(torch.isfinite(loss_sum))
        if self.precision == "fp16":
            self.scaler.step(self.optimizer)  # the scaler skips non-finite steps itself
            self.scaler.update()
        elif finite:
            self.optimizer.step()
        self.non_finite.record(finite or self.precision == "fp16", self.state.update + 1)
        return {
            "loss_sum": loss_sum,
            "nll_sum": nll_sum,
            "grad_norm": grad_norm.detach(),
            "tgt_tokens": local_tokens,
            "src_tokens": sum(batch.num_src_tokens for batch in batches),
            "sentences": sum(batch.src_tokens.size(0) for batch in batches),
            "finite": finite,
        }

    def forward_loss(self, batch: Batch):
        """Summed label-smoothed loss and NLL of one batch (a seam for fault-injection tests)."""
        with autocast(self.device, self.precision):
            logits = self.network(batch.src_tokens, batch.src_padding_mask, batch.tgt_input)
        return sequence_loss(logits, batch.tgt_output, self.pad_id, self.train_cfg.label_smoothing,
                             self.model.tgt_vocab_size)

    # ----------------------------------------------------------------- the loop
    def fit(self) -> Dict[str, Any]:
        """Train until a stop condition; returns the training summary for metrics.json."""
        cfg = self.train_cfg
        self._log_start()
        self.stop_signal.install()
        progress = self._progress_bar()
        window = _Window()
        loop_start = time.perf_counter() - self.state.train_seconds
        stop_reason = self._stop_reason()  # a resumed run may already be done
        try:
            while stop_reason is None:
                batches = self._next_batches()
                if batches is None:
                    stop_reason = f"max_epochs={cfg.max_epochs} reached"
                    break
                self._set_learning_rate()
                self._instrumenting = cfg.instruments and (self.state.update + 1) % cfg.instrument_every == 0
                if self._instrumenting:
                    self.model.collect_statistics(True)
                stats = self._guarded_step(batches)
                self.state.train_seconds = time.perf_counter() - loop_start
                if stats is None:  # out of memory: batch skipped
                    continue
                if not stats["finite"]:  # skipped: the update count does not advance
                    self.state.skipped_updates += 1
                    stop_reason = self._stop_reason()
                    continue
                self.state.update += 1
                window.add(stats)
                if self.state.update % cfg.log_every == 0:
                    self._log_train(window, progress)
                    window = _Window()
                if self.state.update % cfg.validate_every == 0:
                    self.validate_and_save()
                    loop_start = time.perf_counter() - self.state.train_seconds
                if progress is not None:
                    progress.update(1)
                stop_reason = self._stop_reason()
        finally:
            self.stop_signal.uninstall()
            if progress is not None:
                progress.close()
        if window.updates:
            self._log_train(window, None)
        if self._last_saved_update != self.state.update:
            self.validate_and_save()
        log.info("training stopped: %s (update %d, %.0f s)", stop_reason, self.state.update, self.state.train_seconds)
        if self.writer is not None:
            self.writer.flush()
        return {
            "updates": self.state.update,
            "epochs": self.state.epoch,
            "train_time_s": round(self.state.train_seconds, 2),
            "stop_reason": stop_reason,
            "best_update": self.state.best_update,
            "skipped_updates": self.state.skipped_updates,
            "final_train_loss": self.final_train_loss,
            "diverged": False,
        }

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

    def _next_batches(self) -> Optional[List[Batch]]:
        """The next `update_freq` batches of this rank, crossing epoch boundaries as needed."""
        batches: List[Batch] = []
        while len(batches) < self.train_cfg.update_freq:
            if self._epoch_batches is None:
                self._epoch_batches = self.sampler.batches(self.state.epoch)
            if self.state.batch_in_epoch >= len(self._epoch_batches):
                if batches:  # finish the update with what the epoch had left
                    break
                if self.train_cfg.max_epochs is not None and self.state.epoch >= self.train_cfg.max_epochs:
                    return None
                self.state.epoch += 1
                self.state.batch_in_epoch = 0
                self._epoch_batches = self.sampler.batches(self.state.epoch)
                continue
            indices = self._epoch_batches[self.state.batch_in_epoch]
            self.state.batch_in_epoch += 1
            batch = collate(self.data.train, indices, self.pad_id, self.tokenizer.bos_id, self.tokenizer.eos_id,
                            self.train_cfg.pad_to_multiple)
            if self.device.type == "cuda":  # pinned host memory lets the copy overlap compute
                batch = batch.pin_memory()
            batches.append(batch.to(self.device, non_blocking=True))
        return batches

    def _set_learning_rate(self) -> None:
        progress = self.state.train_seconds / self.max_seconds if self.max_seconds else 0.0
        lr = self.schedule.lr(self.state.update + 1, progress)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def _stop_reason(self) -> Optional[str]:
        cfg = self.train_cfg
        if self.dist.any(self.stop_signal.requested):
            return "stop signal"
        if cfg.max_updates is not None and self.state.update >= cfg.max_updates:
            return f"max_updates={cfg.max_updates} reached"
        if self.max_seconds is not None and self.dist.any(self.state.train_seconds >= self.max_seconds):
            return f"max_time={cfg.max_time} reached"
        if cfg.patience is not None and self.state.validations_without_gain >= cfg.patience:
            return f"no val-BLEU gain in {cfg.patience} validations (patience)"
        return None

    # ----------------------------------------------------------------- validation
    def validate_and_save(self) -> Dict[str, float]:
        """Validate (rank 0), save checkpoints, and share the outcome with every rank."""
        results: Dict[str, float] = {}
        if self.dist.is_main:
            results = self.validate()
            score = results["bleu"] if "bleu" in results else -results["loss"]
            improved = score > self.state.best_score
            if improved:
                self.state.best_score = score
                self.state.best_update = self.state.update
                self.state.validations_without_gain = 0
            else:
                self.state.validations_without_gain += 1
            self.save(best=improved)
        # Every rank must agree on the stopping state; rank 0 owns it.
        self.state.validations_without_gain = int(self.dist.broadcast_from_main(self.state.validations_without_gain))
        self.dist.barrier()
        self._last_saved_update = self.state.update
        return results

    @torch.inference_mode()
    def validate(self) -> Dict[str, float]:
        from mtrain.decode import translate_sentences

        self.model.eval()
        loss_sum = nll_sum = tokens = 0.0
        sampler = TokenBatchSampler(
            self.data.valid.src_lengths, self.data.valid.tgt_lengths,
            max_tokens=self.train_cfg.max_tokens, seed=0, shuffle=False,
        )
        for indices in sampler.batches(0):
            batch = collate(self.data.valid, indices, self.pad_id, self.tokenizer.bos_id, self.tokenizer.eos_id)
            batch = batch.to(self.device)
            with autocast(self.device, self.precision):
                logits = self.model(batch.src_tokens, batch.src_padding_mask, batch.tgt_input)
            loss, nll = sequence_loss(logits, batch.tgt_output, self.pad_id, self.train_cfg.label_smoothing,
                                      self.model.tgt_vocab_size)
            loss_sum += float(loss)
            nll_sum += float(nll)
            tokens += batch.num_tgt_tokens
        results = {"loss": loss_sum / max(tokens, 1), "nll_loss": nll_sum / max(tokens, 1)}
        results["ppl"] = math.exp(min(results["nll_loss"], 50.0))
        if self.train_cfg.valid_bleu:
            sources = list(self.data.valid_text.src)
            references = list(self.data.valid_text.tgt)
            if self.train_cfg.valid_max_sentences:
                sources = sources[: self.train_cfg.valid_max_sentences]
                references = references[: self.train_cfg.valid_max_sentences]
            decode_cfg = OmegaConf.merge(self.cfg.decode, {"beam": self.cfg.decode.valid_beam, "nbest": 1})
            hypotheses = translate_sentences(
                self.model, self.tokenizer, sources, decode_cfg, self.device, self.precision
            )
            results["bleu"] = sacrebleu.corpus_bleu([h[0].text for h in hypotheses], [references]).score
        self._write_scalars("valid", results)
        self.last_validation = results
        log.info(
            "valid | update %d | loss %.3f | ppl %.2f%s",
            self.state.update, results["loss"], results["ppl"],
            f" | bleu {results['bleu']:.2f}" if "bleu" in results else "",
        )
        self.model.train()
        return results

    # ----------------------------------------------------------------- checkpoints
    def checkpoint_state(self) -> Dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "rng": rng_state(),
            "trainer": asdict(self.state),
            "update": self.state.update,
            "config": OmegaConf.to_container(self.cfg, resolve=True),
            "mtrain_version": _version(),
        }

    def save(self, best: bool) -> None:
        """update_N.pt, verified loadable, then last.pt (and best.pt) point at it; prune old ones."""
        directory = self.run_dir / CHECKPOINT_DIR
        path = directory / f"update_{self.state.update}.pt"
        save_checkpoint(path, self.checkpoint_state())
        load_checkpoint(path)  # never delete older checkpoints before the new one is known good
        _link_or_copy(path, directory / "last.pt")
        if best:
            _link_or_copy(path, directory / "best.pt")
        for old in update_checkpoints(self.run_dir)[: -max(1, self.train_cfg.keep_last)]:
            old.unlink()
        log.info("saved %s%s", path.name, " (best)" if best else "")

    def resume_from(self, path: Path) -> None:
        state = load_checkpoint(path, map_location="cpu")
        _check_compatible(state.get("config", {}), self.cfg, path)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scaler.load_state_dict(state["scaler"])
        self.state = TrainState(**state["trainer"])
        set_rng_state(state["rng"])
        self._last_saved_update = self.state.update
        log.info("resumed from %s at update %d (epoch %d, batch %d)", path, self.state.update,
                 self.state.epoch, self.state.batch_in_epoch)

    # ----------------------------------------------------------------- logging
    def _log_start(self) -> None:
        params = sum(p.numel() for p in self.model.parameters())
        tokens_per_update = self.train_cfg.max_tokens * self.train_cfg.update_freq * self.dist.world_size
        log.info(
            "model: %.2fM parameters | device %s | precision %s | %d rank(s) | batch budget %d tokens/update "
            "(max_tokens %d x update_freq %d x ranks %d) | %d training pairs",
            params / 1e6, self.device, self.precision, self.dist.world_size, tokens_per_update,
            self.train_cfg.max_tokens, self.train_cfg.update_freq, self.dist.world_size, len(self.data.train),
        )

    def _log_train(self, window: "_Window", progress) -> None:
        values = window.summary()
        mean_src = window.src_tokens / max(window.sentences, 1)
        mean_tgt = window.tgt_tokens / max(window.sentences, 1)
        flops = self.model.flops_per_token(max(1, round(mean_src)), max(1, round(mean_tgt)))
        # Every rank runs at about the same speed: MFU per rank is MFU of the job.
        values["mfu"] = model_flops_utilization(flops, values["tgt_tokens_per_s"], self.peak_flops)
        values["lr"] = self.optimizer.param_groups[0]["lr"]
        self.final_train_loss = values["loss"]
        self._write_scalars("train", values)
        if progress is not None:
            progress.set_postfix(loss=f"{values['loss']:.3f}", lr=f"{values['lr']:.2e}",
                                 tok_s=f"{values['tgt_tokens_per_s']:.0f}")
        if self.dist.is_main:
            log.info(
                "train | update %d | epoch %d | loss %.3f | lr %.2e | gnorm %.2f | tgt tok/s %.0f | src+tgt tok/s %.0f%s",
                self.state.update, self.state.epoch, values["loss"], values["lr"], values["grad_norm"],
                values["tgt_tokens_per_s"], values["src_tgt_tokens_per_s"],
                f" | mfu {100 * values['mfu']:.1f}%" if values.get("mfu") is not None else "",
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
        for name, value in self.model.statistics.items():
            values[f"activations/{name}"] = value
        self.model.collect_statistics(False)
        self._write_scalars("instruments", values, step=self.state.update + 1)

    def _write_scalars(self, prefix: str, values: Dict[str, Optional[float]], step: Optional[int] = None) -> None:
        if self.writer is None:
            return
        for key, value in values.items():
            if value is not None:
                self.writer.add_scalar(f"{prefix}/{key}", value, self.state.update if step is None else step)

    def _progress_bar(self):
        if not self.dist.is_main:
            return None
        from tqdm import tqdm

        return tqdm(total=self.train_cfg.max_updates, initial=self.state.update, unit="upd",
                    dynamic_ncols=True, disable=None, leave=False)


class _Window:
    """Sums over the updates between two log lines (tensors summed lazily, read once)."""

    def __init__(self) -> None:
        self.updates = 0
        self.loss_sum: Any = 0.0
        self.nll_sum: Any = 0.0
        self.grad_norm_sum: Any = 0.0
        self.tgt_tokens = 0
        self.src_tokens = 0
        self.sentences = 0
        self.start = time.perf_counter()

    def add(self, stats: Dict[str, Any]) -> None:
        self.updates += 1
        self.loss_sum = self.loss_sum + stats["loss_sum"]
        self.nll_sum = self.nll_sum + stats["nll_sum"]
        self.grad_norm_sum = self.grad_norm_sum + stats["grad_norm"]
        self.tgt_tokens += stats["tgt_tokens"]
        self.src_tokens += stats["src_tokens"]
        self.sentences += stats.get("sentences", 0)

    def summary(self) -> Dict[str, float]:
        seconds = max(time.perf_counter() - self.start, 1e-9)
        loss = float(self.loss_sum) / max(self.tgt_tokens, 1)
        return {
            "loss": loss,
            "nll_loss": float(self.nll_sum) / max(self.tgt_tokens, 1),
            "grad_norm": float(self.grad_norm_sum) / max(self.updates, 1),
            "tgt_tokens_per_s": self.tgt_tokens / seconds,
            "src_tgt_tokens_per_s": (self.tgt_tokens + self.src_tokens) / seconds,
        }


def _link_or_copy(source: Path, target: Path) -> None:
    """Point `target` at `source`'s bytes atomically (hard link when possible)."""
    import os
    import shutil

    tmp = target.with_name(f".{target.name}.tmp")
    if tmp.exists():
        tmp.unlink()
    try:
        os.link(source, tmp)
    except OSError:
        shutil.copyfile(source, tmp)
    os.replace(tmp, target)


def _check_compatible(saved: Dict[str, Any], cfg: DictConfig, path: Path) -> None:
    """A checkpoint can only resume a run with the same model and tokenizer settings."""
    current = OmegaConf.to_container(cfg, resolve=True)
    for section in ("model", "tokenizer"):
        old, new = saved.get(section, {}), current.get(section, {})
        for key in sorted(set(old) | set(new)):
            if old.get(key) != new.get(key):
                raise MtrainError(
                    f"{path}: checkpoint was trained with {section}.{key}={old.get(key)!r} but the config "
                    f"says {new.get(key)!r}; resume with the original settings or start a new run"
                )


def _version() -> str:
    from mtrain import __version__

    return __version__
