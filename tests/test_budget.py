"""The run's time budget (mtrain.train.budget): the training share of max_time, the stop when the
wall clock runs short, the plan a resume continues, and what decoding a set costs
(mtrain.decode.translation.cost), without a model. The whole run against its budget: tests/test_fit.py."""

from __future__ import annotations

import pytest

from mtrain.cli.fit_scoring import DecodeOutOfTime, ScoringDeadline
from mtrain.config import DecodeConfig, TrainConfig
from mtrain.decode.text.progress import DecodeProgress
from mtrain.decode.translation.cost import StepCost, _solve, decode_seconds
from mtrain.train.budget import EndCost, RunBudget, budget_name, budget_reason, resumed_training_budget
from mtrain.train.progress import TrainState


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_max_time_plans_what_is_left_after_the_start_and_the_end_cost():
    clock = Clock()
    budget = RunBudget(TrainConfig(max_time="2m"), started=clock.now - 15.0, clock=clock)  # 15 s of start-up
    budget.begin(train_seconds=0.0, spent_before=0.0)
    budget.set_estimate(EndCost(validation=10.0, save=1.0, test=20.0))
    assert budget.plan(0.0) == pytest.approx(120 - 15 - 31)
    assert not budget.must_stop()
    clock.now += 60.0
    assert not budget.must_stop(next_update=10.0) and budget.must_stop(next_update=20.0)  # it would end too late
    clock.now += 120 - 15 - 31 - 60  # the planned training, no slower than planned
    assert budget.must_stop()  # exactly what follows is left


def test_max_train_time_caps_the_share_and_alone_plans_nothing():
    clock = Clock()
    both = RunBudget(TrainConfig(max_time="25m", max_train_time="20m"), started=clock.now, clock=clock)
    both.begin(0.0, 0.0)
    both.set_estimate(EndCost(60.0, 2.0, 60.0))
    assert both.plan(0.0) == 20 * 60
    assert budget_name(TrainConfig(max_time="25m", max_train_time="20m"), 20 * 60) == "max_train_time=20m"
    alone = RunBudget(TrainConfig(max_train_time="20m"), started=clock.now, clock=clock)
    alone.begin(0.0, 0.0)
    assert alone.plan(0.0) == 20 * 60 and not alone.must_stop() and alone.deadline is None


def test_a_validation_corrects_the_end_cost_and_periodic_ones_share_the_time_left():
    clock = Clock()
    budget = RunBudget(TrainConfig(max_time="10m"), started=clock.now, clock=clock)
    budget.begin(0.0, 0.0)
    budget.set_estimate(EndCost(validation=10.0, save=0.0, test=30.0))
    clock.now += 100.0  # 90 s of training, then a validation twice as long as estimated
    budget.note_validation(20.0)
    budget.note_overhead(10.0)
    assert budget.cost == EndCost(20.0, 0.0, 60.0)
    # 600 - 100 - 80 left; each training second brings 10/90 s of validations: 420 / (1 + 1/9)
    assert budget.plan(90.0) == pytest.approx(90.0 + 420.0 / (1 + 10 / 90))


def test_validate_every_time_is_reserved_before_the_first_validation():
    clock = Clock()
    budget = RunBudget(TrainConfig(max_time="10m", validate_every_time="1m"), started=clock.now, clock=clock)
    budget.begin(0.0, 0.0)
    budget.set_estimate(EndCost(validation=6.0, save=0.0, test=0.0))
    assert budget.plan(0.0) == pytest.approx(594.0 / 1.1)


def test_a_resumed_session_counts_the_earlier_ones():
    clock = Clock()
    budget = RunBudget(TrainConfig(max_time="2m"), started=clock.now, clock=clock)
    budget.begin(train_seconds=50.0, spent_before=70.0)
    assert budget.seconds_left() == pytest.approx(50.0)
    assert budget.wall_seconds() == pytest.approx(70.0)


def test_a_resume_keeps_its_plan_and_a_raised_max_time_goes_to_training():
    saved = TrainConfig(max_time="2m")
    assert resumed_training_budget(saved, TrainConfig(max_time="2m"), 80.0) == 80.0
    assert resumed_training_budget(saved, TrainConfig(max_time="3m"), 80.0) == 140.0
    assert resumed_training_budget(saved, TrainConfig(max_time="3m", max_train_time="100s"), 80.0) == 100.0
    assert resumed_training_budget(saved, TrainConfig(max_updates=10), 80.0) is None
    assert (
        resumed_training_budget(TrainConfig(max_updates=10), TrainConfig(max_time="2m"), None) is None
    )  # planned anew
    # A checkpoint from before max_time covered the whole run: all of its max_time was training.
    assert resumed_training_budget(saved, TrainConfig(max_time="2m"), None) == 120.0


def test_the_planned_share_is_what_ends_training():
    cfg = TrainConfig(max_time="2m")
    assert budget_reason(TrainState(train_seconds=79.0, train_budget_seconds=80.0), cfg) is None
    assert budget_reason(TrainState(train_seconds=80.0, train_budget_seconds=80.0), cfg) == "max_time=2m reached"


def test_the_end_cost_is_measured_again_during_training_and_a_validation_s_error_carries_over():
    clock = Clock()
    budget = RunBudget(TrainConfig(max_time="10m"), started=clock.now, clock=clock)
    budget.begin(0.0, 0.0)
    budget.set_estimate(EndCost(validation=10.0, save=1.0, test=30.0), seconds=0.5)
    clock.now += 59.0
    assert not budget.measure_due()  # every minute at least ...
    clock.now += 1.0
    assert budget.measure_due()
    budget.note_validation(20.0)  # twice as long as measured
    budget.set_estimate(EndCost(validation=20.0, save=1.0, test=60.0), seconds=3.0)  # the machine got busier
    assert budget.cost == EndCost(40.0, 1.0, 120.0) and budget.estimated == EndCost(10.0, 1.0, 30.0)
    assert budget.plan(50.0) == pytest.approx(50.0 + 600 - 60 - 161)
    clock.now += 149.0
    assert not budget.measure_due()  # ... and at most 1/50 of the time: 3 s of measuring, every 150 s
    clock.now += 1.0
    assert budget.measure_due()
    unbounded = RunBudget(TrainConfig(max_train_time="10m"), started=clock.now, clock=clock)
    unbounded.set_estimate(EndCost(1.0, 1.0, 1.0))
    clock.now += 1000.0
    assert not unbounded.measure_due()  # without max_time nothing is kept for the end


def test_the_test_decode_is_skipped_or_stopped_to_keep_to_the_deadline():
    clock = Clock()
    references = ["a small dog runs ."] * 10
    hopeless = ScoringDeadline(clock.now + 30.0, expected=100.0, max_time="2m", clock=clock)
    with pytest.raises(DecodeOutOfTime, match=r"^test: skipped to keep to max_time=2m: 30 s left and the test decode"):
        hopeless.check_start("test", references)  # 100 s measured, under 30 left: not started
    deadline = ScoringDeadline(clock.now + 30.0, expected=60.0, max_time="2m", clock=clock)
    end = deadline.check_start("test", references)  # within twice what is left: tried
    assert clock.now + 29.0 < end < clock.now + 30.0  # its scoring kept
    on_batch = deadline.guard("test", DecodeProgress("test", 100, None), end)
    clock.now += 10.0
    on_batch(40)  # the next batch of ~10 s ends at 20 s: go on
    clock.now += 5.0
    on_batch(30)  # ... of ~5 s, at 20 s
    clock.now += 10.0
    with pytest.raises(DecodeOutOfTime, match=r"^test: stopped after 90 of 100 sentences to keep to max_time=2m"):
        on_batch(20)  # ... of ~10 s would end at 35 s: stopped


def test_decoding_costs_a_batch_its_longest_sentence_and_each_sentence_its_own_steps():
    cfg = DecodeConfig(beam=1, max_tokens=20, max_len_a=2.0, max_len_b=0)
    # sources of 10, 10 and 5 tokens: batches [0, 1] (2 x 10 <= 20) and [2]
    seconds = decode_seconds(StepCost(per_batch=1.0, per_sentence=0.1), [10, 10, 5], [3, 7, 100], cfg)
    # steps: references + eos, within 2 x source: 4, 8, 10
    assert seconds == pytest.approx((1.0 * 8 + 0.1 * 12) + (1.0 * 10 + 0.1 * 10))


def test_two_timings_split_into_batch_and_sentence_costs_never_below_zero():
    exact = _solve(small=1.0 + 4 * 0.1, batches_small=1, n_small=4, large=1.0 + 64 * 0.1, batches_large=1, n_large=64)
    assert exact.per_batch == pytest.approx(1.0) and exact.per_sentence == pytest.approx(0.1)
    inverted = _solve(small=2.0, batches_small=1, n_small=4, large=1.5, batches_large=1, n_large=64)  # noise
    assert inverted == StepCost(1.5, 0.0)
