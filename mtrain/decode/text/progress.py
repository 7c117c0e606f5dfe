"""Progress of a long decode (`mtrain fit`'s validation and test decodes): sentences done,
sentences/s and the time left, as a bar on a terminal and as a log line every `interval`
seconds, which reaches a log file or a pipe where no bar shows (a decode of the CPU preset's
test set takes minutes on busy cores)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from types import TracebackType

from tqdm import tqdm

from mtrain.durations import format_duration

log = logging.getLogger("mtrain")


class DecodeProgress:
    """Counts decoded sentences (`update`, e.g. as `translate_encoded`'s `on_batch`) and reports
    them; a context manager (the bar is closed on leaving)."""

    def __init__(
        self,
        label: str,
        total: int,
        interval: float | None,
        write: Callable[[str], None] = log.info,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        """`label` starts each line ("valid", "test de-en"); `interval` None: no lines, a bar only."""
        self.label, self.total, self.interval = label, total, interval
        self.write, self.clock = write, clock
        self.done = 0
        self.start = self.last_line = clock()
        # disable=None: shown on a terminal, silent in logs and pipes (the lines serve those).
        self.bar = tqdm(total=total, desc=label, unit="sent", dynamic_ncols=True, disable=None, leave=False)

    def update(self, sentences: int) -> None:
        self.done += sentences
        self.bar.update(sentences)
        now = self.clock()
        if self.interval is not None and now - self.last_line >= self.interval and self.done < self.total:
            self.last_line = now
            self.write(self.line(now))

    def line(self, now: float) -> str:
        """'valid | decoded 400/1,014 sentences | 21.3 sentences/s | ~29 s left'."""
        rate = self.done / max(now - self.start, 1e-9)
        left = (self.total - self.done) / rate if rate > 0 else float("inf")
        return (
            f"{self.label} | decoded {self.done:,}/{self.total:,} sentences | {rate:.1f} sentences/s | "
            f"~{format_duration(left) if left != float('inf') else '?'} left"
        )

    def close(self) -> None:
        self.bar.close()

    def __enter__(self) -> DecodeProgress:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()
