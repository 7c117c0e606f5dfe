"""Faults during training: stop signals, non-finite updates, out-of-memory batches.

Each is turned into a decision the training loop can act on at an update boundary, so
that a checkpoint is never written mid-update and a user is told what happened.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Iterator
from types import FrameType
from typing import Any

import torch

from mtrain.errors import MtrainError

log = logging.getLogger("mtrain")


class StopRequested(BaseException):
    """Raised by `StopSignal` at once inside `StopSignal.interruptible()`. A BaseException,
    as KeyboardInterrupt is: no `except Exception` on the way swallows it."""


class StopSignal:
    """SIGTERM/SIGINT ask for a checkpoint at the next update boundary; a second one exits now.

    Inside `interruptible()` (a phase that only reads, or writes atomically: data preparation,
    validation, the test decode) the signal raises StopRequested where the process stands, so
    a long phase does not run to its end first.

    `signum` and `name` say which signal stopped training (the exit status is 128 + signum,
    as a shell reports a process killed by it, so a scheduler can tell it from an error).
    """

    def __init__(self) -> None:
        self.requested = False
        self.signum = 0
        self._previous: dict[int, Any] = {}  # signal -> the handler it had (signal.signal's answer)
        self._interruptible: str | None = None  # the phase a signal stops at once

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else "a signal"

    def interrupted(self, where: str) -> TrainingInterrupted:
        """The one-line error of a stop, 'stopped by SIGTERM <where>', exiting 128 + signum."""
        return TrainingInterrupted(f"stopped by {self.name} {where}", 128 + self.signum)

    def install(self) -> None:
        if self._previous:  # already installed (mtrain fit installs it before preparing data)
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (e.g. inside some test runners)
                pass

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    @contextlib.contextmanager
    def interruptible(self, phase: str) -> Iterator[None]:
        """Within, a stop signal (or one that came before) raises StopRequested; `phase`
        names what it stops in the log line."""
        if self.requested:
            raise StopRequested()
        self._interruptible = phase
        try:
            yield
        finally:
            self._interruptible = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            log.warning("second %s: exiting now without a checkpoint", signal.Signals(signum).name)
            os._exit(128 + signum)
        self.requested = True
        self.signum = signum
        phase = self._interruptible
        if phase is not None:
            self._interruptible = None  # raised once: the handlers of the phase's cleanup run in peace
            log.warning("%s received: stopping the %s", signal.Signals(signum).name, phase)
            raise StopRequested()
        log.warning(
            "%s received: finishing this update, writing a checkpoint, then exiting (send it again to exit at once)",
            signal.Signals(signum).name,
        )


class NonFiniteGuard:
    """Counts updates skipped for a non-finite loss or gradient; aborts after too many in a row.

    The counting happens on the device (`record` takes the update's flag as a tensor and never
    reads it), so a GPU is not made to wait for the host once per update; `check` reads the
    counts — one synchronisation — at log intervals and before checkpoints.
    """

    def __init__(self, max_consecutive: int, device: torch.device) -> None:
        self.max_consecutive = max_consecutive
        self._new_skipped = torch.zeros((), dtype=torch.int64, device=device)  # since the last check
        self._consecutive = torch.zeros((), dtype=torch.int64, device=device)  # the current run of them
        self._longest = torch.zeros((), dtype=torch.int64, device=device)  # longest run since the last check

    def record(self, skipped: torch.Tensor) -> None:
        """One update's flag (a bool tensor): True when its step was skipped as non-finite."""
        skipped = skipped.to(torch.int64)
        self._new_skipped += skipped
        self._consecutive = (self._consecutive + 1) * skipped  # back to 0 after a good update
        self._longest = torch.maximum(self._longest, self._consecutive)

    def check(self, update: int) -> int:
        """The number of updates skipped since the last check (after update `update`);
        raises TrainingDiverged after `max_consecutive` skipped in a row."""
        new_skipped, longest = (int(value) for value in torch.stack([self._new_skipped, self._longest]).tolist())
        self._new_skipped.zero_()
        self._longest.copy_(self._consecutive)
        if new_skipped:
            log.warning(
                "non-finite loss or gradient: %d update(s) up to update %d skipped (weights and "
                "optimizer state left as they were)",
                new_skipped,
                update,
            )
        if longest >= self.max_consecutive:
            raise TrainingDiverged(
                f"training diverged: {longest} consecutive updates had a non-finite loss or "
                f"gradient (up to update {update}); the last good checkpoint is kept. Lower train.lr, "
                "raise train.warmup_updates, or use train.precision=fp32"
            )
        return new_skipped


class TrainingDiverged(MtrainError):
    """Raised when too many consecutive updates are non-finite."""


class TrainingInterrupted(MtrainError):
    """A stop signal ended training after a checkpoint was written; exit with `exit_status`."""

    def __init__(self, message: str, exit_status: int) -> None:
        super().__init__(message)
        self.exit_status = exit_status


def is_out_of_memory(error: BaseException) -> bool:
    if isinstance(error, torch.OutOfMemoryError):
        return True
    return isinstance(error, RuntimeError) and ("out of memory" in str(error) or "can't allocate memory" in str(error))


class OutOfMemoryGuard:
    """Skips batches that ran out of memory; aborts after too many in a row."""

    def __init__(self, max_consecutive: int) -> None:
        self.max_consecutive = max_consecutive
        self.consecutive = 0

    def record_failure(self, shape: str, max_tokens: int) -> None:
        self.consecutive += 1
        log.warning("out of memory on a batch of shape %s; batch skipped (%d in a row)", shape, self.consecutive)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        if self.consecutive >= self.max_consecutive:
            raise MtrainError(
                f"out of memory on {self.consecutive} consecutive batches; lower train.max_tokens "
                f"(now {max_tokens}) and raise train.update_freq to keep the tokens per update"
            )

    def record_success(self) -> None:
        self.consecutive = 0
