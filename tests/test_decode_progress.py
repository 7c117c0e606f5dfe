"""Progress of a long decode (mtrain.decode.text.progress): a line every interval, with the rate and the time left."""

from __future__ import annotations

from mtrain.decode.text.progress import DecodeProgress
from mtrain.durations import format_duration


def test_a_line_every_interval_with_the_rate_and_the_time_left():
    now, lines = [0.0], []
    with DecodeProgress("valid", 1000, 30.0, write=lines.append, clock=lambda: now[0]) as progress:
        now[0] = 10.0
        progress.update(200)  # before the interval: no line
        now[0] = 40.0
        progress.update(200)
        now[0] = 50.0
        progress.update(300)  # 10 s after the last line: none
        now[0] = 80.0
        progress.update(300)  # the last batch: the decode's own result line follows, not this one
    assert lines == ["valid | decoded 400/1,000 sentences | 10.0 sentences/s | ~1m00s left"]


def test_no_interval_no_lines():
    lines = []
    with DecodeProgress("test", 10, None, write=lines.append) as progress:
        progress.update(5)
    assert lines == []


def test_durations_read_as_in_the_log():
    assert [format_duration(s) for s in (0.4, 45, 81, 3600 + 5 * 60 + 20)] == ["0 s", "45 s", "1m21s", "1h05m"]
