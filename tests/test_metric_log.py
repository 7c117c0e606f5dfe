"""What the trainer reports: throughput excludes validation; first-update and time-left display."""

from __future__ import annotations

import time

import torch

from mtrain.train.metric_log import Window


def stats(tokens: int) -> dict:
    zero = torch.zeros(())
    return {"loss_sum": zero, "nll_sum": zero, "grad_norm": zero, "tgt_tokens": tokens, "src_tokens": tokens,
            "sentences": 1}


def test_throughput_excludes_paused_time():
    window = Window()
    window.add(stats(1000))
    busy = time.perf_counter() - window.start
    window.pause()
    time.sleep(0.3)  # a validation
    window.resume()
    rate = window.summary()["tgt_tokens_per_s"]
    assert rate > 1000 / (busy + 0.15)  # the 0.3 s pause did not count


def test_mfu_is_a_share_of_a_datasheet_peak_and_never_above_one():
    import torch

    from mtrain.train.throughput import model_flops_utilization, peak_flops

    assert peak_flops(torch.device("cpu"), "bf16") is None  # a CPU has no datasheet peak
    assert model_flops_utilization(45.6e6, 3000.0, None) is None
    assert model_flops_utilization(1e9, 300e3, 989e12) == 1e9 * 300e3 / 989e12  # 30%
    assert model_flops_utilization(1e9, 300e3, 1e14) is None  # 300%: a wrong peak, not printed
