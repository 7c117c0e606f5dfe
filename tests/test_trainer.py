"""The trainer's own rules, without a corpus on disk: best and patience, the budget, what is
due when, one public update, and the loop that calls it (validation and saves when due, a
resumed trainer continuing exactly). End-to-end runs of `mtrain fit`: tests/test_fit.py."""

from __future__ import annotations

import copy
import re
import time

import pytest
import torch

from mtrain.config import Precision, TrainConfig
from mtrain.model import build_model
from mtrain.train import budget as budget_module
from mtrain.train.budget import EndCost, budget_reason
from mtrain.train.builders import build_parts
from mtrain.train.distributed import DistributedContext
from mtrain.train.progress import TrainState, ValidationRhythm, training_progress
from mtrain.train.random_state import seed_everything
from mtrain.train.trainer import Trainer
from tests.fit_runs import compose_fit
from tests.synthetic_training import IDS, TINY_MODEL, VOCAB
from tests.synthetic_training import synthetic_corpus as _corpus
from tests.synthetic_training import synthetic_trainer as _trainer


# ---------------------------------------------------------------------- progress rules
def test_best_is_the_highest_bleu_and_a_tie_is_no_gain():
    state = TrainState(update=10)
    assert state.record_validation({"bleu": 20.0, "loss": 3.0}) is True
    state.update = 20
    assert state.record_validation({"bleu": 20.0, "loss": 2.0}) is False  # a tie: no gain
    state.update = 30
    assert state.record_validation({"bleu": 19.0, "loss": 1.0}) is False
    assert (state.best_score, state.best_update, state.validations_without_gain) == (20.0, 10, 2)
    state.update = 40
    assert state.record_validation({"bleu": 21.5, "loss": 1.0}) is True
    assert (state.best_score, state.best_update, state.validations_without_gain) == (21.5, 40, 0)


def test_without_bleu_the_lowest_loss_is_best():
    state = TrainState(update=5)
    assert state.record_validation({"loss": 4.0}) and state.best_score == -4.0
    state.update = 6
    assert not state.record_validation({"loss": 4.5})
    state.update = 7
    assert state.record_validation({"loss": 3.0}) and state.best_update == 7


def test_budget_reasons_in_their_order():
    cfg = TrainConfig(max_updates=100, max_time="1m", patience=2)
    assert budget_reason(TrainState(update=99, train_seconds=59.0), cfg) is None
    assert budget_reason(TrainState(update=100, train_seconds=99.0), cfg) == "max_updates=100 reached"
    assert budget_reason(TrainState(update=50, train_seconds=60.0), cfg) == "max_time=1m reached"
    assert budget_reason(TrainState(update=50), cfg, out_of_time=True) == "max_time=1m reached"  # another rank's clock
    assert budget_reason(TrainState(update=50, train_seconds=60.0), cfg, out_of_time=False) is None
    patient = TrainState(update=50, validations_without_gain=2)
    assert budget_reason(patient, cfg) == "no val-BLEU gain in 2 validations (patience)"
    assert budget_reason(TrainState(update=10**6), TrainConfig()) is None  # no budget: never done


def test_validation_is_due_every_n_updates_and_every_interval_of_training_time():
    rhythm = ValidationRhythm(TrainConfig(validate_every=50, validate_every_time="2m"))
    assert rhythm.by_updates(TrainState(update=100)) and not rhythm.by_updates(TrainState(update=101))
    assert not rhythm.by_time(TrainState(train_seconds=119.0))
    assert rhythm.by_time(TrainState(train_seconds=120.0))
    rhythm.last_seconds = 120.0  # measured from the last validation, on the training clock
    assert not rhythm.by_time(TrainState(train_seconds=200.0)) and rhythm.by_time(TrainState(train_seconds=240.0))
    assert not ValidationRhythm(TrainConfig(validate_every_time=None)).by_time(TrainState(train_seconds=1e9))


# ---------------------------------------------------------------------- a trainer on a synthetic corpus
def test_run_update_counts_one_update_and_moves_the_weights():
    trainer = _trainer()
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    stats = trainer.run_update()
    assert trainer.state.update == 1 and trainer.state.batch_in_epoch == 1
    assert stats["tgt_tokens"] > 0 and torch.isfinite(stats["loss_sum"])
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(3e-3 / 5)  # update 1 of 5 warmup
    moved = [name for name, p in trainer.model.named_parameters() if not torch.equal(before[name], p)]
    assert len(moved) == len(before)
    assert all(p.grad is None for p in trainer.model.parameters())  # freed for validation and checkpoints
    assert trainer.state.train_seconds > 0


def test_fit_validates_when_due_stops_at_the_budget_and_validates_the_last_update():
    validated = []

    class Saves:
        def __init__(self):
            self.saved = []

        def due(self):
            return False

        def save(self, state, update, best):
            self.saved.append((update, best))

    saves = Saves()
    losses = iter([3.0, 2.0, 2.5, 1.0])
    trainer = _trainer(
        ["train.max_updates=14", "train.validate_every=4", "train.save_every=null"],
        validate=lambda: validated.append(trainer.state.update) or {"loss": next(losses)},
        checkpointer=saves,
    )
    summary = trainer.fit()
    assert summary["stop_reason"] == "max_updates=14 reached" and summary["updates"] == 14
    assert validated == [4, 8, 12, 14]  # every 4 updates, and the last one
    assert saves.saved == [(4, True), (8, True), (12, False), (14, True)]
    assert summary["best_update"] == 14 and trainer.state.validations_without_gain == 0


def test_a_run_that_trains_its_max_train_time_stops_naming_it_not_max_time():
    """Training ends half an update before its plan: the reason names the key that set the plan
    (a 20-minute run within max_time=25m said "max_time=25m reached" at 1,199 s)."""
    trainer = _trainer(["train.max_train_time=20m", "train.max_time=25m"])
    trainer.state.train_seconds, trainer.update_seconds = 1199.0, 4.0  # the next update would end past 1,200 s
    assert trainer._stop_reason(trainer._agree()) == "max_train_time=20m reached"
    assert trainer.state.train_budget_seconds == 1199.0  # the plan is now what was trained


def test_under_max_time_the_end_cost_is_measured_again_off_the_training_clock(monkeypatch, caplog):
    """Each measurement after the first is off the training clock and in the plan; one that
    differs by more than a quarter from the last is logged."""
    monkeypatch.setattr(budget_module, "MEASURE_INTERVAL_S", 0.0)  # due after every update
    monkeypatch.setattr(budget_module, "MEASURE_EVERY", 0)
    measured = []

    def end_cost() -> EndCost:
        measured.append(len(measured))
        time.sleep(0.05)
        return EndCost(validation=1.0, save=0.0, test=2.0 * len(measured))  # the machine gets busier

    cfg = compose_fit([*TINY_MODEL, "train.max_time=10m", "train.max_updates=5", "train.validate_every=1000"])
    seed_everything(cfg.seed)
    model = build_model(cfg.model, VOCAB, VOCAB, IDS.pad, joint_vocab=True)
    parts = build_parts(model, cfg.train, cfg.seed, [_corpus()], IDS, torch.device("cpu"), Precision.fp32)
    trainer = Trainer(cfg.train, parts, DistributedContext(), validate=lambda: {"loss": 1.0}, end_cost=end_cost)
    with caplog.at_level("INFO", logger="mtrain"):
        summary = trainer.fit()
    assert summary["stop_reason"] == "max_updates=5 reached"
    assert len(measured) == 5  # before the first update, then after updates 1-4 (not after the last)
    assert trainer.budget.run.overhead_seconds >= 4 * 0.05  # counted as time off training
    assert trainer.budget.run.measured == EndCost(1.0, 0.0, 10.0)
    assert trainer.budget.run.estimated == EndCost(1.0, 0.0, 2.0)  # the first, which the end line names
    assert re.search(
        r"budget: what follows training measured again \(in 0\.\d s\): validation ~1 s, checkpoints ~0 s, "
        r"test decode ~4 s \(was validation ~1 s, checkpoints ~0 s, test decode ~2 s\); \d+m\d+s of training planned",
        caplog.text,
    )


def test_patience_stops_training_after_validations_without_gain():
    trainer = _trainer(
        ["train.max_updates=100", "train.validate_every=2", "train.patience=2"], validate=lambda: {"loss": 2.0}
    )  # never better than the first
    summary = trainer.fit()
    # validations at 2 (best), 4 and 6 (no gain); the budget is read before each validation, so
    # the loop stops after the next update, which is validated as the last one
    assert summary["updates"] == 7 and summary["stop_reason"] == "no val-BLEU gain in 2 validations (patience)"
    assert trainer.state.best_update == 2


def test_max_epochs_ends_training_and_the_last_update_is_validated():
    trainer = _trainer(["train.max_epochs=1", "train.validate_every=1000"])
    batches_per_epoch = len(trainer.parts.batches.samplers[0].batches(1))
    summary = trainer.fit()
    assert summary["stop_reason"] == "max_epochs=1 reached" and summary["updates"] == batches_per_epoch
    assert trainer.last_validation == {"loss": 1.0}


@pytest.mark.parametrize("shape_buckets", [0, 4])
def test_a_trainer_restored_from_a_checkpoint_continues_exactly(shape_buckets):
    overrides = [f"train.shape_buckets={shape_buckets}"]
    straight = _trainer(overrides)
    for _ in range(6):
        straight.run_update()
    checkpoint = copy.deepcopy(straight.checkpoint_state())  # as saved: the tensors go on changing
    expected = [float(straight.run_update()["loss_sum"]) for _ in range(4)]

    resumed = _trainer(overrides)
    resumed.load_state(checkpoint)
    assert resumed.state.update == 6
    assert [float(resumed.run_update()["loss_sum"]) for _ in range(4)] == expected
    assert all(
        torch.equal(a, b)
        for a, b in zip(straight.model.state_dict().values(), resumed.model.state_dict().values(), strict=True)
    )


def test_with_log_every_huge_a_line_still_comes_every_log_every_time(tmp_path, caplog):
    from mtrain.train.metric_log import MetricLogger

    trainer = _trainer(["train.max_updates=4", "train.log_every=1000", "train.validate_every=1000"])
    # every update takes more than a millisecond: each is due by time
    trainer.metrics = MetricLogger(tmp_path / "tb", 4, 0, lambda src, tgt: 0.0, None, log_every_seconds=0.001)
    with caplog.at_level("INFO", logger="mtrain"):
        trainer.fit()
    trainer.metrics.close()
    logged = [int(n) for n in re.findall(r"train \| update (\d+)/4 \|", caplog.text)]
    assert logged == [1, 2, 3, 4]  # not only the first and the last


def _loss_points(trainer: Trainer, tb_dir, caplog) -> tuple[list[str], dict[int, float]]:
    """Fit `trainer` with a metric logger writing to `tb_dir`: its `train loss` lines and train/loss."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    caplog.clear()
    with caplog.at_level("INFO", logger="mtrain"):
        trainer.fit()
    trainer.metrics.close()
    accumulator = EventAccumulator(str(tb_dir))
    accumulator.Reload()
    lines = [line.split(" - ", 1)[-1] for line in caplog.text.splitlines() if "train loss |" in line]
    return lines, {event.step: event.value for event in accumulator.Scalars("train/loss")}


def test_a_same_seed_run_under_load_logs_the_same_loss_points(tmp_path, monkeypatch, caplog):
    """Issue 59: the loss curve falls at fixed updates, each point the mean over the same updates,
    whatever the wall-clock cadence of the lines and however slow the machine: a run whose
    updates are slowed (a busy machine) and logged every millisecond logs the same points, at
    the same updates, with the same values, as one logged by updates alone."""
    from mtrain.train.metric_log import MetricLogger
    from mtrain.train.step import UpdateStep

    overrides = ["train.max_updates=12", "train.log_every=5", "train.loss_every=4", "train.validate_every=1000"]
    calm = _trainer(overrides)
    calm.metrics = MetricLogger(tmp_path / "calm", 12, 0, lambda src, tgt: 0.0, None, loss_every=4)
    calm_lines, calm_scalars = _loss_points(calm, tmp_path / "calm", caplog)

    step = UpdateStep.or_skip

    def slowed(self, *args, **kwargs):
        time.sleep(0.01)  # the other jobs of a busy machine
        return step(self, *args, **kwargs)

    monkeypatch.setattr(UpdateStep, "or_skip", slowed)
    busy = _trainer(overrides)
    busy.metrics = MetricLogger(
        tmp_path / "busy", 12, 0, lambda src, tgt: 0.0, None, log_every_seconds=0.001, loss_every=4
    )
    busy_lines, busy_scalars = _loss_points(busy, tmp_path / "busy", caplog)
    assert len(re.findall(r"train \| update \d+/12 \|", caplog.text)) == 12  # a line by time after every update

    assert sorted(calm_scalars) == sorted(busy_scalars) == [4, 8, 12]
    assert calm_scalars == busy_scalars
    assert [line.split(" | ")[1] for line in calm_lines] == ["update 4", "update 8", "update 12"]
    assert calm_lines == busy_lines


def test_progress_says_the_update_against_max_updates_and_the_training_time_left():
    state = TrainState(update=120, train_seconds=60.0)
    progress = training_progress(state, max_updates=2000, seconds_per_update=0.5)
    assert progress.seconds_left == pytest.approx(1880 * 0.5)
    assert (progress.describe(), progress.describe_left()) == ("update 120/2000", "~15m40s of training left")
    no_budget = training_progress(state, None, 0.5)
    assert (no_budget.describe(), no_budget.describe_left()) == ("update 120", None)  # nothing left to time
    untimed = training_progress(state, 2000, None)
    assert (untimed.describe(), untimed.describe_left()) == ("update 120/2000", None)  # no update timed yet


def test_progress_under_a_time_budget_says_the_share_spent_and_the_first_budget_to_end_sets_the_time_left():
    state = TrainState(update=120, train_seconds=420.0, train_budget_seconds=1200.0)
    by_time = training_progress(state, None, 3.5)
    assert (by_time.describe(), by_time.describe_left()) == ("update 120 | 35% of 20m00s", "~13m00s of training left")
    both = training_progress(state, 150, 3.5)  # max_updates ends first: 30 updates of 3.5 s
    assert (both.describe(), both.describe_left()) == ("update 120/150 | 35% of 20m00s", "~1m45s of training left")


def test_training_lines_say_the_update_of_max_updates_and_the_time_left(tmp_path, caplog):
    from mtrain.train.metric_log import MetricLogger

    trainer = _trainer(["train.max_updates=4", "train.log_every=2", "train.validate_every=1000"])
    trainer.metrics = MetricLogger(tmp_path / "tb", 4, 0, lambda src, tgt: 0.0, None)
    with caplog.at_level("INFO", logger="mtrain"):
        trainer.fit()
    trainer.metrics.close()
    lines = re.findall(r"train \| (update \d+/4) \| epoch .*?( \| ~\d+ s of training left)?\n", caplog.text)
    assert [update for update, _ in lines] == ["update 1/4", "update 2/4", "update 4/4"]
    assert all(left for _, left in lines)  # timed from the updates of this session


def test_a_resumed_run_closes_the_open_loss_point_as_the_unbroken_run_does():
    """A checkpoint at update 6 of points every 4 updates: the point at update 8 is still the
    mean of updates 5-8 after the resume, the same value to the bit."""
    from mtrain.train.metric_log import MetricLogger

    overrides = ["train.loss_every=4"]

    def logged(trainer: Trainer) -> Trainer:
        trainer.metrics = MetricLogger(None, None, 0, lambda src, tgt: 0.0, None, loss_every=4)
        return trainer

    straight = logged(_trainer(overrides))
    for _ in range(8):
        straight.run_update()
    expected = straight.metrics.curve.read()

    interrupted = logged(_trainer(overrides))
    for _ in range(6):
        interrupted.run_update()
    checkpoint = copy.deepcopy(interrupted.checkpoint_state())
    assert interrupted.metrics.curve.read() == expected[:1]
    resumed = logged(_trainer(overrides))
    resumed.load_state(checkpoint)
    for _ in range(2):
        resumed.run_update()
    assert [(p.first_update, p.update) for p in expected] == [(1, 4), (5, 8)]
    assert resumed.metrics.curve.read() == expected[1:]
