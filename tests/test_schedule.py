"""Learning-rate schedules and duration parsing."""

import math

import pytest

from mtrain.config import TrainConfig
from mtrain.errors import MtrainError
from mtrain.train.schedule import LearningRateSchedule, parse_duration


def test_parse_duration_units():
    assert parse_duration("90s") == 90
    assert parse_duration("20m") == 1200
    assert parse_duration("2h") == 7200
    assert parse_duration("1.5h") == 5400
    assert parse_duration("45") == 45
    assert parse_duration(None) is None


def test_parse_duration_rejects_garbage_naming_the_key():
    with pytest.raises(MtrainError, match="train.max_time"):
        parse_duration("twenty minutes")


def test_inverse_sqrt_warms_up_linearly_then_decays():
    schedule = LearningRateSchedule(TrainConfig(lr=1e-3, warmup_updates=100, scheduler="inverse_sqrt"))
    assert schedule.lr(50) == pytest.approx(5e-4)
    assert schedule.lr(100) == pytest.approx(1e-3)
    assert schedule.lr(400) == pytest.approx(1e-3 * math.sqrt(100 / 400))


def test_linear_decay_by_updates_reaches_min_lr():
    cfg = TrainConfig(lr=1e-3, warmup_updates=10, scheduler="linear", decay_updates=110, min_lr=0.0)
    schedule = LearningRateSchedule(cfg)
    assert schedule.lr(10) == pytest.approx(1e-3 * (1 - 10 / 110))
    assert schedule.lr(110) == pytest.approx(0.0)
    lrs = [schedule.lr(u) for u in range(11, 111)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))


def test_time_driven_cosine_follows_progress():
    cfg = TrainConfig(lr=2e-3, warmup_updates=0, scheduler="cosine", max_time="10m")
    schedule = LearningRateSchedule(cfg)
    assert schedule.lr(5, progress=0.0) == pytest.approx(2e-3)
    assert schedule.lr(5, progress=0.5) == pytest.approx(1e-3)
    assert schedule.lr(5, progress=1.0) == pytest.approx(0.0, abs=1e-12)


def test_decay_without_horizon_is_a_config_error():
    with pytest.raises(MtrainError, match="train.decay_updates"):
        LearningRateSchedule(TrainConfig(scheduler="cosine"))
