"""The machine's share of a process (mtrain.machine_share), on given clocks. A fit beside a busy
process, whose log names its share: tests/test_fit.py."""

from __future__ import annotations

import os

import pytest

from mtrain.machine_share import Share, ShareMeter


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
