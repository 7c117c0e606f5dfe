"""Host memory of a training process: freed pages handed back to the OS, peaks per phase.

On a CPU the activations are allocated and freed every update in shapes that change from
batch to batch, and glibc keeps the freed blocks mapped (mtrain.runtime.release_free_host_memory):
handing them back every `trim_every` updates keeps the resident size near what is used,
at no cost in speed for 10 (docs/PERFORMANCE.md). The peaks go to metrics.json.
"""

from __future__ import annotations

from mtrain.runtime import peak_host_memory_mb, release_free_host_memory

# Updates between returns of freed host memory to the OS on a CPU run: every update costs
# speed, every 10 does not (docs/PERFORMANCE.md).
HOST_MEMORY_TRIM_EVERY = 10


class HostMemory:
    """`after_update` trims when due; `note_peak(phase)` records the peak resident memory."""

    def __init__(self, trim_every: int) -> None:
        self.trim_every = trim_every  # 0: never (a GPU run: its activations live on the device)
        self.peaks: dict[str, int] = {}  # MB per phase: training, validation

    def after_update(self, update: int) -> None:
        if self.trim_every and update % self.trim_every == 0:
            release_free_host_memory()

    def note_peak(self, phase: str) -> dict[str, int]:
        """Fold the process's peak resident memory since the last note into `phase`'s and start a
        new peak; returns the peaks so far (empty where the system does not say)."""
        peak = peak_host_memory_mb(reset=True)
        if peak is not None:
            self.peaks[phase] = max(self.peaks.get(phase, 0), round(peak))
        return dict(self.peaks)
