"""How much of the machine a process gets: the CPU time it was given against its wall time.

On a machine other jobs keep busy a run gets a share of its cores, and everything it does by
the clock (a time budget's updates, a decode's sentences per second) shrinks with that share;
nothing else in the log tells why. `ShareMeter` measures the share over the windows it is told
to count (e.g. training's updates, not the pauses between), and `Share` says what it found in
one line, with the load average where the OS gives one. A shared core below the pipeline:
training and decoding can both use it.

The CPU time of a process counts every thread, and threads that wait for each other spin a
while before sleeping (OpenMP), so a busy machine's share over-states the work done: the CPU
preset's training at load 9 on 2 cores got 9% of its 2 CPUs and made 35-110 target tokens/s,
1-2% of its idle 4,900-6,200. What the share costs is "at most" that share of the updates.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from mtrain.wording import counted

# Below this share of its threads' CPUs a run is said to be slowed by the machine: an idle
# 2-core machine gives a 2-thread training ~95%; the slack covers Python's serial parts.
LOW_SHARE = 0.70


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity where the OS says, else the machine's)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def load_average() -> float | None:
    """The last minute's load average (runnable threads), None where the OS has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


@dataclass(frozen=True)
class Share:
    """CPU seconds a process got over `wall_seconds` of counted time with `cpus` it could use."""

    cpu_seconds: float
    wall_seconds: float
    cpus: int
    load: float | None  # load average at the end of the window (None: unknown)

    @property
    def fraction(self) -> float:
        """The share of its CPUs the process got: 1.0 is all of them all the time."""
        return self.cpu_seconds / max(self.wall_seconds * self.cpus, 1e-9)

    @property
    def low(self) -> bool:
        return self.fraction < LOW_SHARE

    def figures(self) -> dict[str, float | int | None]:
        """For metrics.json."""
        return {
            "share": round(self.fraction, 3),
            "cpus": self.cpus,
            "cpu_s": round(self.cpu_seconds, 1),
            "wall_s": round(self.wall_seconds, 1),
            "load_average": None if self.load is None else round(self.load, 2),
        }

    def describe(self, what: str = "this run") -> str:
        """'other processes use this machine: this run got 53% of 2 CPUs (load average 3.4 on 2 CPUs)'.

        The load average is the machine's (runnable threads, this process's included, over the
        last minute): at or above its CPUs and a half, others compete for them. Below, the
        process still ran less than its threads could (other processes on the CPUs it may use,
        or its threads waited), which the line says without naming a cause."""
        machine_cpus = os.cpu_count() or self.cpus
        load = "" if self.load is None else f" (load average {self.load:.1f} on {counted(machine_cpus, 'CPU')})"
        got = f"{what} got {100 * self.fraction:.0f}% of {counted(self.cpus, 'CPU')}{load}"
        if self.load is not None and self.load < machine_cpus + 0.5:
            return f"{got}, less than its threads could use"
        return f"other processes use this machine: {got}"

    def in_words(self) -> str:
        """The share as a reader says it: 'half', 'a third', '62%'."""
        fraction = self.fraction
        for value, words in ((0.25, "a quarter"), (1 / 3, "a third"), (0.5, "half"), (2 / 3, "two thirds")):
            if abs(fraction - value) < 0.04:
                return words
        return f"{100 * fraction:.0f}%"


class ShareMeter:
    """Sums CPU and wall time over the windows a caller counts: `start`, then `lap(count)` at
    each boundary (`count=False` drops the time since the last lap: a pause not to count)."""

    def __init__(
        self,
        threads: int,
        cpu_clock: Callable[[], float] = time.process_time,
        wall_clock: Callable[[], float] = time.monotonic,
        load: Callable[[], float | None] = load_average,
    ) -> None:
        """`threads`: the threads the measured work runs (capped at the CPUs it may use)."""
        self.cpus = max(1, min(threads, usable_cpus()))
        self.cpu_clock, self.wall_clock, self.load = cpu_clock, wall_clock, load
        self.cpu_seconds = self.wall_seconds = 0.0
        self._last: tuple[float, float] | None = None

    def start(self) -> None:
        self._last = (self.cpu_clock(), self.wall_clock())

    def lap(self, count: bool = True) -> None:
        """Add the time since the last lap (or `start`) when `count`; begin the next window."""
        now = (self.cpu_clock(), self.wall_clock())
        if count and self._last is not None:
            self.cpu_seconds += now[0] - self._last[0]
            self.wall_seconds += now[1] - self._last[1]
        self._last = now

    def share(self) -> Share:
        return Share(self.cpu_seconds, self.wall_seconds, self.cpus, self.load())
