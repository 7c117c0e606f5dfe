"""The machine's share of a process (mtrain.machine_share), on given clocks; and a fit beside a
busy process, which keeps to its max_time and names its share (its own file: a minute of wall
time on a worker of its own, not after test_fit.py's)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from mtrain.machine_share import Share, ShareMeter
from tests.conftest import REPO_ROOT as REPO
from tests.fit_runs import BUDGET_MARGIN_S, TINY


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_share_is_cpu_time_over_wall_time_of_the_windows_counted():
    cpu, wall = Clock(), Clock()
    busy = float(os.cpu_count() or 1) + 2.0  # more runnable threads than CPUs: others compete
    meter = ShareMeter(threads=1, cpu_clock=cpu, wall_clock=wall, load=lambda: busy)
    meter.start()
    cpu.now, wall.now = cpu.now + 5.0, wall.now + 10.0
    meter.lap()  # counted: 5 CPU seconds in 10
    cpu.now, wall.now = cpu.now + 1.0, wall.now + 100.0
    meter.lap(count=False)  # a pause (a validation): not counted
    share = meter.share()
    assert share.fraction == pytest.approx(0.5) and share.low
    assert share.in_words() == "half"
    assert share.describe("training").startswith(
        f"other processes use this machine: training got 50% of 1 CPU (load average {busy:.1f} on "
    )
    assert share.figures() == {"share": 0.5, "cpus": 1, "cpu_s": 5.0, "wall_s": 10.0, "load_average": busy}


def test_a_share_near_all_is_not_low_and_a_quiet_load_names_no_other_process():
    full = Share(cpu_seconds=19.0, wall_seconds=10.0, cpus=2, load=None)
    assert not full.low and full.in_words() == "95%"
    quiet = Share(cpu_seconds=6.0, wall_seconds=10.0, cpus=1, load=0.5)
    assert quiet.low and quiet.describe() == (
        f"this run got 60% of 1 CPU (load average 0.5 on {os.cpu_count()} CPU"
        f"{'' if os.cpu_count() == 1 else 's'}), less than its threads could use"
    )


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="pins the run and a busy process to one CPU (Linux)")
def test_beside_a_busy_process_the_run_keeps_to_max_time_and_names_the_machine_s_share(tmp_path, multi30k_slice):
    """A fit and a CPU-bound process pinned to one CPU: the run gets about half of it, or less
    when other tests share the machine. It still ends within train.max_time and the margin (what
    follows training is measured on the busy CPU, the test decode keeps to the deadline: scored,
    or skipped or stopped with a line), and its log names its share once during training and
    again at the end, with what that means for the budget."""
    cpu = {max(os.sched_getaffinity(0))}
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    os.sched_setaffinity(busy.pid, cpu)
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "mtrain", "fit", f"data.local_dir={multi30k_slice}"]
    tiny = [override for override in TINY if not override.startswith("train.num_threads=")]
    command += [f"data.cache_dir={tmp_path / 'cache'}", *tiny, "train.num_threads=1", "train.max_time=60s"]
    command += ["train.valid_bleu=false", "train.validate_every=100000", "decode.max_tokens=200"]
    command += [f"hydra.run.dir={run_dir}"]  # (decode.max_tokens: batches of ~7 sentences, a deadline between)
    try:
        start = time.monotonic()
        fit = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
        os.sched_setaffinity(fit.pid, cpu)  # (before Python has started a thread: all of them inherit it)
        _, stderr = fit.communicate(timeout=300)
        wall = time.monotonic() - start
    finally:
        busy.kill()
        busy.wait()
    assert wall <= 60 + BUDGET_MARGIN_S, wall
    if fit.returncode == 2 and "which leaves no time to train" in stderr:
        pytest.skip(stderr.strip().splitlines()[-1])  # start-up alone took the budget (see the test above)
    assert fit.returncode == 0, stderr[-3000:]
    train_log = (run_dir / "train.log").read_text()
    share = (
        r"training got \d+% of 1 CPU \(load average [\d.]+ on \d+ CPUs?\)[^;]*; a max_time=60s budget trains at most"
    )
    metrics = json.loads((run_dir / "metrics.json").read_text())
    # Said after 10 s of training (at the first update past it, if it trained as long), and at the end;
    # a run that stops near 10 s may or may not have made an update past it (11.0 s: said twice).
    trained = metrics["train_time_s"]
    said = {1} if trained < 10 else {2} if trained > 12 else {1, 2}
    assert len(re.findall(share, train_log)) in said, train_log[-3000:]
    assert "machine share over the whole training: " in train_log
    assert metrics["machine_share"]["share"] < 0.7 and metrics["machine_share"]["cpus"] == 1
    assert ("test" in metrics) != ("test_skipped" in metrics)  # scored, or not within the budget (and said so)
