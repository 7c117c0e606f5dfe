"""Host memory of a training process: freed pages handed back to the OS, peaks per phase, and
what is still available (`init_from=` a Hugging Face model checks its size against it).

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


def available_host_memory() -> int | None:
    """Bytes this process can still take: Linux's MemAvailable, lowered to what is left under
    the cgroup's limit (a container's memory.max); None where the system does not say."""
    available = None
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    try:
        with open("/sys/fs/cgroup/memory.max") as limit, open("/sys/fs/cgroup/memory.current") as used:
            cap = limit.read().strip()
            if cap != "max" and available is not None:
                available = min(available, int(cap) - int(used.read().strip()))
    except (OSError, ValueError):
        pass  # cgroup v1, or no limit: MemAvailable alone
    return available
