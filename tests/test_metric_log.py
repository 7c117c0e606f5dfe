"""What the trainer reports: throughput excludes validation; first-update and time-left display;
the loss curve's points at fixed updates."""

from __future__ import annotations

import re
import time

import torch

from mtrain.train.metric_log import Window


def stats(tokens: int, loss_sum: float = 0.0, nll_sum: float = 0.0) -> dict:
    zero = torch.zeros(())
    return {
        "loss_sum": torch.tensor(loss_sum),
        "nll_sum": torch.tensor(nll_sum),
        "grad_norm": zero,
        "tgt_tokens": tokens,
        "src_tokens": tokens,
        "sentences": 1,
    }


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


def test_under_ddp_throughput_counts_every_rank_and_mfu_each_ranks_share(monkeypatch):
    """Rank 0 logs: its loss is averaged over its own targets, its tokens/s over the job's
    (fairseq's figures are the job's too), and MFU sets each rank's share against one peak."""
    from mtrain.train import metric_log

    now = [100.0]  # the window opens at 100 s and is read at 102 s
    monkeypatch.setattr(metric_log.time, "perf_counter", lambda: now[0])
    logger = metric_log.MetricLogger(None, None, 0, lambda src, tgt: 1e9, peak_flops=1e12, ranks=2)
    rank0 = {**stats(1000), "loss_sum": torch.tensor(2000.0), "job_tgt_tokens": 2000, "job_src_tokens": 2200}
    logger.update(rank0, update=1)
    now[0] = 102.0
    values = {}
    monkeypatch.setattr(logger, "scalars", lambda prefix, logged, step: values.update(logged))
    logger.log_train(update=1, epoch=1, lr=1e-3)
    assert logger.last_train_loss == 2.0  # 2000 / rank 0's 1,000 targets
    assert values["tgt_tokens_per_s"] == 1000.0  # 2,000 job targets in 2 s
    assert values["src_tgt_tokens_per_s"] == 2100.0
    assert values["mfu"] == 1e9 * 500.0 / 1e12  # each rank: 500 tok/s against its own peak


def test_on_a_terminal_log_lines_go_through_the_progress_bar(tmp_path, monkeypatch):
    """A log line written past a shown bar would land inside it: while the bar is shown the
    root logger's console handler writes through tqdm.write (which redraws the bar below the
    line); closing restores the handler, and loggers without one gain none."""
    import io
    import logging
    import sys

    from mtrain.train import metric_log

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    root = logging.getLogger()
    console = logging.StreamHandler(terminal)
    # The root logger as a command sets it up (one console handler), whatever handlers earlier
    # tests in this process (in-process Hydra runs) left on it.
    earlier_handlers = list(root.handlers)
    for handler in earlier_handlers:
        root.removeHandler(handler)
    root.addHandler(console)
    mtrain_handlers = list(logging.getLogger("mtrain").handlers)
    try:
        logger = metric_log.MetricLogger(tmp_path / "tb", 10, 0, lambda src, tgt: 1.0, None)
        assert logger.progress is not None and not logger.progress.disable
        assert console not in root.handlers
        assert logging.getLogger("mtrain").handlers == mtrain_handlers
        logger.update(stats(10), update=1)
        logging.getLogger("mtrain").warning("a line of its own")
        logger.close()
        assert console in root.handlers
    finally:
        root.removeHandler(console)
        for handler in earlier_handlers:
            root.addHandler(handler)
    written = terminal.getvalue()
    assert "\na line of its own\n" in written.replace("\r", "\n")
    assert written.count("a line of its own") == 1


def test_a_window_is_due_by_time_its_pauses_excluded(monkeypatch):
    from mtrain.train import metric_log

    now = [100.0]
    monkeypatch.setattr(metric_log.time, "perf_counter", lambda: now[0])
    logger = metric_log.MetricLogger(None, None, 0, lambda s, t: 0.0, None, log_every_seconds=30.0)
    logger.update(stats(10), update=1)
    now[0] = 120.0
    assert not logger.due_by_time()
    logger.pause()
    now[0] = 500.0  # a long validation: its own lines report it
    logger.resume()
    assert not logger.due_by_time()
    now[0] = 510.0
    assert logger.due_by_time()
    assert not metric_log.MetricLogger(None, None, 0, lambda s, t: 0.0, None).due_by_time()  # null: by updates only


def test_loss_points_are_the_means_of_fixed_runs_of_updates_however_often_they_are_read():
    """Read after every update (lines by time on a slow machine) or once at the end, the curve
    gives the same points: the means per target token of updates 1-3 and 4-6; the partial run
    7-8 is no point yet. A skipped (non-finite) update's tokens count for nothing."""
    from mtrain.train.loss_curve import LossCurve, LossPoint

    updates = [stats(100, loss_sum=100.0 * u, nll_sum=50.0 * u) for u in range(1, 9)]
    updates[4] = {**stats(100), "skipped": torch.tensor(True)}  # update 5: its step skipped, its sums 0
    for every_update in updates:
        every_update.setdefault("skipped", torch.tensor(False))
    often, once = LossCurve(every=3), LossCurve(every=3)
    read_often = []
    for update, every_update in enumerate(updates, start=1):
        often.add(every_update, update)
        once.add(every_update, update)
        read_often += often.read()
    expected = [LossPoint(3, 1, 2.0, 1.0), LossPoint(6, 4, (400.0 + 600.0) / 200, (200.0 + 300.0) / 200)]
    assert read_often == expected
    assert once.read() == expected and once.read() == []  # read once
    all_skipped = LossCurve(every=1)
    all_skipped.add(updates[4], 5)
    assert all_skipped.read() == []  # no loss to plot, and no NaN in the log or TensorBoard


def test_train_loss_goes_to_tensorboard_at_the_curves_updates_only(monkeypatch, caplog):
    """The window's lines (by time) keep their own loss; train/loss holds the points, at the
    multiples of loss_every, each logged as a `train loss` line."""
    from mtrain.train import metric_log

    logger = metric_log.MetricLogger(None, None, 0, lambda s, t: 0.0, None, loss_every=2)
    logger.writer = object()  # rank 0's: lines are logged (scalars are caught below)
    written = []
    monkeypatch.setattr(logger, "scalars", lambda prefix, values, step: written.append((step, dict(values))))
    with caplog.at_level("INFO", logger="mtrain"):
        for update in range(1, 6):
            logger.update(stats(10, loss_sum=10.0 * update), update)
            logger.log_train(update, 1, 1e-3)  # a line after every update, as by time
    logger.writer = None
    losses = [(step, values["loss"]) for step, values in written if "loss" in values]
    assert losses == [(2, 1.5), (4, 3.5)]
    lines = re.findall(
        r"train loss \| update \d+ \| loss [\d.]+ \| nll_loss [\d.]+ \| mean of updates \d+-\d+", caplog.text
    )
    assert lines == [
        "train loss | update 2 | loss 1.5000 | nll_loss 0.0000 | mean of updates 1-2",
        "train loss | update 4 | loss 3.5000 | nll_loss 0.0000 | mean of updates 3-4",
    ]
