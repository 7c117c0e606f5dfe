"""How many CPU threads `mtrain translate` and `mtrain eval` decode with.

Decoding multiplies small matrices, one step at a time, so its threads spend much of each
step waiting for one another; on cores that other jobs keep busy they wait far longer (beam
5 on 2 cores at load 7: 9.5 sentences/s with 1 thread, 1.6 with 2). So unless `num_threads`
is given, decoding takes the idle cores, at most 4 (where more gain little) and at least 1:
    threads = max(1, min(4, usable cores - round(1-minute load average)))
"""

from __future__ import annotations

import logging
import os
from typing import Optional

import torch

MAX_DEFAULT_THREADS = 4

log = logging.getLogger("mtrain")


def default_decode_threads(cores: int, load: float) -> int:
    """Threads for `cores` usable cores of which `load` are busy (see the module docstring)."""
    return max(1, min(MAX_DEFAULT_THREADS, cores - round(load)))


def set_decode_threads(num_threads: Optional[int]) -> int:
    """Set torch's intra-op threads to `num_threads`, or to the default when it is None;
    returns the number (CTranslate2 is given the same)."""
    if num_threads:
        torch.set_num_threads(num_threads)
        return num_threads
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    threads = default_decode_threads(cores, load)
    torch.set_num_threads(threads)
    log.info("decoding with %d CPU thread%s (%d cores, load %.1f; num_threads=N to choose)",
             threads, "" if threads == 1 else "s", cores, load)
    return threads
