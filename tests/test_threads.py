"""Decoding threads (mtrain.decode.threads): the idle cores, 1 to 4, unless num_threads is given."""

from __future__ import annotations

import torch

from mtrain.decode.threads import default_decode_threads, set_decode_threads


def test_default_takes_the_idle_cores_between_one_and_four():
    assert default_decode_threads(cores=2, load=7.4) == 1  # busy: threads would wait on each other
    assert default_decode_threads(cores=2, load=0.3) == 2
    assert default_decode_threads(cores=8, load=3.0) == 4
    assert default_decode_threads(cores=64, load=0.0) == 4
    assert default_decode_threads(cores=1, load=0.0) == 1


def test_num_threads_wins_over_the_default(caplog):
    assert set_decode_threads(3) == 3 and torch.get_num_threads() == 3
    with caplog.at_level("INFO", logger="mtrain"):
        chosen = set_decode_threads(None)
    assert 1 <= chosen <= 4 and torch.get_num_threads() == chosen
    assert f"decoding with {chosen} CPU thread" in caplog.text and "num_threads=N" in caplog.text
