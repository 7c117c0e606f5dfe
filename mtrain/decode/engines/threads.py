"""How many CPU threads `mtrain translate`, `mtrain eval`, `mtrain serve` and the validation
and test decodes of `mtrain fit` decode with.

A fixed number unless `num_threads=N` says otherwise, never one read from the machine's
load: matrix products split their sums differently over another number of threads, so a
beam can break a near-tie the other way and a sentence comes out differently (a pipe decode
at 1 thread and a file decode at 2 differed on one line of 1,000 when the count followed the
load average). With a fixed count the same command gives the same output however busy the
machine is, and every report records the count (`threads`).

The default is 1: decoding multiplies small matrices one step at a time, so its threads
spend much of each step waiting for one another, and on cores that other jobs keep busy
they wait far longer (beam 5 on 2 cores at load 7: 9.5 sentences/s with 1 thread, 1.6 with
2; measured again below). On idle cores more threads decode faster (below: 1.4-1.75x with
2), which `num_threads=N` asks for knowingly. One thread is also the count at which the
output cannot depend on how many cores the machine has. `mtrain fit` trains with
`train.num_threads` and decodes its validation and test sets with `train.decode_num_threads`
(`decode_threads`, the same default of 1), so its test decode gives what `mtrain eval` gives
on the same checkpoint, as fast.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from mtrain.wording import counted

# `scripts/bench_decode.py --modes beam5 --cache on --precisions fp32,bf16 --devices cpu --ct2 ""
# --sentences N --threads T` (its random benchmark-size model), 1 and 2 threads interleaved twice,
# 2-core AMD EPYC (avx2, avx512_bf16, no amx):
# - busy, load ~4, 40 sentences: 1 thread 459-576 tgt tok/s fp32, 1,028-1,737 bf16; 2 threads
#   82-147 and 109-259 (the same 40 outputs);
# - idle, load 0.3, 200 sentences: 1 thread 1,024-1,057 fp32, 1,758-1,762 bf16; 2 threads
#   1,574-1,639 and 2,430-3,091.
DEFAULT_DECODE_THREADS = 1


def set_decode_threads(num_threads: int | None) -> int:
    """Set torch's intra-op threads to `num_threads`, or to DEFAULT_DECODE_THREADS when it is
    None; returns the number (CTranslate2 is given the same). Nothing is logged here: the
    command says how many threads it decodes with once, in the line that starts its work
    (`describe_threads`), after every check that can refuse it."""
    threads = num_threads or DEFAULT_DECODE_THREADS
    torch.set_num_threads(threads)
    return threads


def describe_threads(threads: int, key: str = "num_threads", chosen: bool = False) -> str:
    """How a log line names the decoding threads: "1 CPU thread, the default (num_threads=N to
    choose)", or "2 CPU threads (num_threads=2)" when `chosen` by the config key `key`."""
    if chosen:
        return f"{counted(threads, 'CPU thread')} ({key}={threads})"
    return f"{counted(threads, 'CPU thread')}, the default ({key}=N to choose)"


@contextlib.contextmanager
def decode_threads(num_threads: int | None) -> Iterator[int]:
    """Decode with `num_threads` (None: DEFAULT_DECODE_THREADS) inside the block, and give the
    threads back as they were after it: `mtrain fit` trains with train.num_threads and
    decodes its validation and test sets by the rule above."""
    before = torch.get_num_threads()
    try:
        yield set_decode_threads(num_threads)
    finally:
        torch.set_num_threads(before)
