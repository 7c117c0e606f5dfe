"""What the trainer reports: log lines, TensorBoard scalars, a progress bar, throughput.

Training statistics arrive as device tensors and are summed lazily over a log window;
they are read on the host once per `train.log_every` updates, or once the window has run
`train.log_every_time` (slow updates), so logging adds no host synchronisation to the updates
in between. A training line averages its own window, which the machine's speed decides; the
loss curve (`mtrain.train.loss_curve`: TensorBoard's train/loss and the `train loss` lines)
averages fixed runs of `train.loss_every` updates, and compares across runs.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from mtrain.train.loss_curve import LossCurve, LossPoint
from mtrain.train.progress import TrainingProgress
from mtrain.train.throughput import model_flops_utilization

log = logging.getLogger("mtrain")


class MetricLogger:
    """Log lines (rank 0), TensorBoard scalars under `tensorboard_dir`, and a tqdm bar on a terminal."""

    def __init__(
        self,
        tensorboard_dir: Path | None,
        total_updates: int | None,
        initial_update: int,
        flops_per_token: Callable[[int, int], float],
        peak_flops: float | None,
        ranks: int = 1,
        log_every_seconds: float | None = None,
        loss_every: int = 50,
    ) -> None:
        """`log_every_seconds`: the longest a window may run before `due_by_time` (None: never);
        `loss_every`: the updates of each point of the loss curve (train.loss_every)."""
        self.writer = None
        if tensorboard_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(tensorboard_dir))
        self.flops_per_token = flops_per_token
        self.peak_flops = peak_flops
        self.ranks = ranks
        self.log_every_seconds = log_every_seconds
        self.window = Window()
        self.curve = LossCurve(loss_every)
        self.last_train_loss = float("nan")
        self.progress = None
        if tensorboard_dir is not None:  # rank 0 only
            from tqdm import tqdm

            # disable=None: shown on a terminal, silent in logs and pipes.
            self.progress = tqdm(
                total=total_updates, initial=initial_update, unit="upd", dynamic_ncols=True, disable=None, leave=False
            )
        self._log_redirect: contextlib.AbstractContextManager[None] | None = None
        if self.progress is not None and not self.progress.disable:
            from tqdm.contrib.logging import logging_redirect_tqdm

            # On a terminal, log lines written past the bar would land in the middle of it:
            # the console handlers (Hydra's, on the root logger) write through tqdm.write while
            # the bar is shown, which clears the bar, prints the line and draws the bar again.
            consoles = [
                logger
                for logger in (logging.getLogger(), log)
                if any(
                    isinstance(handler, logging.StreamHandler) and handler.stream in (sys.stdout, sys.stderr)
                    for handler in logger.handlers
                )
            ]
            if consoles:  # (a logger without a console handler would gain one: lines twice)
                self._log_redirect = logging_redirect_tqdm(loggers=consoles)
                self._log_redirect.__enter__()

    def update(self, stats: dict[str, Any], update: int) -> None:
        """Update `update`'s statistics (tensors are not read here)."""
        self.window.add(stats)
        self.curve.add(stats, update)
        if self.progress is not None:
            self.progress.update(1)

    def pause(self) -> None:
        """Exclude what follows (validation, checkpoints) from the window's throughput."""
        self.window.pause()

    def resume(self) -> None:
        self.window.resume()

    def due_by_time(self) -> bool:
        """The window has run `log_every_seconds` of training (validation excluded): time for a
        line however few updates it holds (slow updates would leave the log silent for minutes)."""
        return self.log_every_seconds is not None and self.window.seconds() >= self.log_every_seconds

    def log_train(self, update: int, epoch: int, lr: float, progress: TrainingProgress | None = None) -> None:
        """A log line and scalars for the window of updates since the last call, then the loss
        curve's points closed since (`log_loss_points`); `progress` says how far training is
        (the line's start) and the training time left (its end, and the progress bar's)."""
        window, self.window = self.window, Window()
        if not window.updates:
            self.log_loss_points()
            return
        values = window.summary()
        mean_src = window.src_tokens / max(window.sentences, 1)
        mean_tgt = window.tgt_tokens / max(window.sentences, 1)
        flops = self.flops_per_token(max(1, round(mean_src)), max(1, round(mean_tgt)))
        # Tokens/s are the job's (all ranks); each rank has its own device and peak.
        mfu = model_flops_utilization(flops, values["tgt_tokens_per_s"] / self.ranks, self.peak_flops)
        if mfu is not None:  # None: the device's peak is unknown (not logged)
            values["mfu"] = mfu
        values["lr"] = lr
        self.last_train_loss = values["loss"]
        # The window's losses are the line's; train/loss and train/nll_loss are the curve's points.
        self.scalars("train", {k: v for k, v in values.items() if k not in ("loss", "nll_loss")}, update)
        seconds_left = progress.seconds_left if progress is not None else None
        if self.progress is not None:
            postfix = {"loss": f"{values['loss']:.3f}", "lr": f"{lr:.2e}", "tok_s": f"{values['tgt_tokens_per_s']:.0f}"}
            if seconds_left is not None:
                postfix["left"] = f"{int(max(seconds_left, 0)) // 60}m{int(max(seconds_left, 0)) % 60:02d}s"
            self.progress.set_postfix(postfix)
        if self.writer is not None:
            log.info(
                "train | %s | epoch %d | loss %.3f | lr %.2e | gnorm %.2f | tgt tok/s %.0f | src+tgt tok/s %.0f%s%s",
                progress.describe() if progress is not None else f"update {update}",
                epoch,
                values["loss"],
                lr,
                values["grad_norm"],
                values["tgt_tokens_per_s"],
                values["src_tgt_tokens_per_s"],
                f" | mfu {100 * values['mfu']:.1f}%" if values.get("mfu") is not None else "",
                f" | {left}" if progress is not None and (left := progress.describe_left()) is not None else "",
            )
        self.log_loss_points()

    def log_loss_points(self) -> list[LossPoint]:
        """The loss curve's points closed since the last call: a `train loss` line each, and
        train/loss and train/nll_loss at their updates. Returns them."""
        points = self.curve.read()
        for point in points:
            self.scalars("train", {"loss": point.loss, "nll_loss": point.nll_loss}, point.update)
            if self.writer is not None:
                log.info(
                    "train loss | update %d | loss %.4f | nll_loss %.4f | mean of updates %d-%d",
                    point.update,
                    point.loss,
                    point.nll_loss,
                    point.first_update,
                    point.update,
                )
        return points

    def log_valid(self, update: int, results: dict[str, float], seconds: float) -> None:
        self.scalars("valid", results, update)
        details = "".join(f" | {key} {value:.2f}" for key, value in results.items() if key not in ("loss", "ppl"))
        log.info(
            "valid | update %d | loss %.3f | ppl %.2f%s | %.1f s",
            update,
            results.get("loss", float("nan")),
            results.get("ppl", float("nan")),
            details,
            seconds,
        )

    def log_draw(self, draw: Any, update: int) -> None:
        """An epoch's draw from several corpora (mtrain.batches.mixture.EpochDraw), as its first
        update `update` begins it: one log line, and each corpus's shares as scalars."""
        log.info("%s", draw.describe())
        for label, shares in draw.shares().items():
            self.scalars(f"draw/{label}", shares, update)

    def scalars(self, prefix: str, values: Mapping[str, float | None], step: int) -> None:
        if self.writer is None:
            return
        for key, value in values.items():
            if isinstance(value, (int, float)):
                self.writer.add_scalar(f"{prefix}/{key}", value, step)

    def close(self) -> None:
        self.log_loss_points()
        if self._log_redirect is not None:
            self._log_redirect.__exit__(None, None, None)
            self._log_redirect = None
        if self.progress is not None:
            self.progress.close()
            self.progress = None
        if self.writer is not None:
            self.writer.flush()
            self.writer.close()
            self.writer = None


class Window:
    """Sums over the updates between two log lines (tensors summed lazily, read once)."""

    def __init__(self) -> None:
        self.updates = 0
        self.loss_sum: Any = 0.0
        self.nll_sum: Any = 0.0
        self.grad_norm_sum: Any = 0.0
        self.skipped: Any = 0  # updates whose step was skipped as non-finite (their sums are 0)
        self.skipped_tgt_tokens: Any = 0  # and their target tokens
        self.tgt_tokens = 0  # this rank's: the loss is averaged over them
        self.src_tokens = 0
        self.job_tgt_tokens = 0  # all ranks': the throughput counts them
        self.job_src_tokens = 0
        self.sentences = 0
        self.start = time.perf_counter()
        self.paused_at: float | None = None

    def add(self, stats: dict[str, Any]) -> None:
        self.updates += 1
        self.loss_sum = self.loss_sum + stats["loss_sum"]
        self.nll_sum = self.nll_sum + stats["nll_sum"]
        self.grad_norm_sum = self.grad_norm_sum + stats["grad_norm"]
        if "skipped" in stats:
            skipped = stats["skipped"].to(torch.int64)
            self.skipped = self.skipped + skipped
            self.skipped_tgt_tokens = self.skipped_tgt_tokens + skipped * stats["tgt_tokens"]
        self.tgt_tokens += stats["tgt_tokens"]
        self.src_tokens += stats["src_tokens"]
        self.job_tgt_tokens += stats.get("job_tgt_tokens", stats["tgt_tokens"])
        self.job_src_tokens += stats.get("job_src_tokens", stats["src_tokens"])
        self.sentences += stats.get("sentences", 0)

    def pause(self) -> None:
        self.paused_at = time.perf_counter()

    def resume(self) -> None:
        if self.paused_at is not None:
            self.start += time.perf_counter() - self.paused_at  # the pause does not count
            self.paused_at = None

    def seconds(self) -> float:
        """How long the window has run, its pauses excluded."""
        return (self.paused_at or time.perf_counter()) - self.start

    def summary(self) -> dict[str, float]:
        seconds = max(self.seconds(), 1e-9)
        good = max(self.updates - int(self.skipped), 1)
        good_tokens = self.tgt_tokens - int(self.skipped_tgt_tokens)
        return {
            "loss": float(self.loss_sum) / max(good_tokens, 1),
            "nll_loss": float(self.nll_sum) / max(good_tokens, 1),
            "grad_norm": float(self.grad_norm_sum) / good,
            "tgt_tokens_per_s": self.job_tgt_tokens / seconds,
            "src_tgt_tokens_per_s": (self.job_tgt_tokens + self.job_src_tokens) / seconds,
        }
