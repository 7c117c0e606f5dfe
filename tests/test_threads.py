"""Decoding threads (mtrain.decode.threads): a fixed default, never read from the machine's
load, unless num_threads is given."""

from __future__ import annotations

import os

import pytest
import torch

from mtrain.decode.threads import DEFAULT_DECODE_THREADS, set_decode_threads


@pytest.mark.parametrize("load", [0.0, 7.4])
def test_the_default_does_not_follow_the_load_average(load, monkeypatch, caplog):
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    with caplog.at_level("INFO", logger="mtrain"):
        chosen = set_decode_threads(None)
    assert chosen == DEFAULT_DECODE_THREADS == torch.get_num_threads()
    assert f"decoding with {chosen} CPU thread" in caplog.text and "num_threads=N" in caplog.text


def test_num_threads_wins_over_the_default(caplog):
    previous = torch.get_num_threads()
    try:
        with caplog.at_level("INFO", logger="mtrain"):
            assert set_decode_threads(3) == 3 and torch.get_num_threads() == 3
        assert "decoding with 3 CPU threads (num_threads" in caplog.text
    finally:
        torch.set_num_threads(previous)
