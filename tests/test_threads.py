"""Decoding threads (mtrain.decode.engines.threads): a fixed default, never read from the machine's
load, unless num_threads is given."""

from __future__ import annotations

import os

import pytest
import torch

from mtrain.decode.engines.threads import DEFAULT_DECODE_THREADS, decode_threads, describe_threads, set_decode_threads


@pytest.mark.parametrize("load", [0.0, 7.4])
def test_the_default_does_not_follow_the_load_average(load, monkeypatch, caplog):
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    with caplog.at_level("INFO", logger="mtrain"):
        chosen = set_decode_threads(None)
    assert chosen == DEFAULT_DECODE_THREADS == torch.get_num_threads()
    assert caplog.text == ""  # the command says it once, in the line that starts its work


def test_num_threads_wins_over_the_default():
    previous = torch.get_num_threads()
    try:
        assert set_decode_threads(3) == 3 and torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(previous)


def test_the_thread_line_agrees_with_the_count_and_names_the_key():
    assert describe_threads(1) == "1 CPU thread, the default (num_threads=N to choose)"
    assert describe_threads(2, chosen=True) == "2 CPU threads (num_threads=2)"
    assert describe_threads(1, "train.decode_num_threads", chosen=True) == "1 CPU thread (train.decode_num_threads=1)"


def test_decode_threads_gives_the_training_threads_back():
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with decode_threads(None) as threads:
            assert threads == torch.get_num_threads() == DEFAULT_DECODE_THREADS
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(previous)
