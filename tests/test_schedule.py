"""Learning-rate schedules and duration parsing."""

import itertools
import math

import pytest

from mtrain.config import TrainConfig
from mtrain.durations import parse_duration
from mtrain.errors import MtrainError
from mtrain.train.schedule import LearningRateSchedule


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
    assert all(a >= b for a, b in itertools.pairwise(lrs))


def test_time_driven_cosine_follows_progress():
    cfg = TrainConfig(lr=2e-3, warmup_updates=0, scheduler="cosine", max_time="10m")
    schedule = LearningRateSchedule(cfg)
    assert schedule.lr(5, progress=0.0) == pytest.approx(2e-3)
    assert schedule.lr(5, progress=0.5) == pytest.approx(1e-3)
    assert schedule.lr(5, progress=1.0) == pytest.approx(0.0, abs=1e-12)


def test_decay_without_horizon_is_a_config_error():
    """The rule lives in mtrain.config_checks, which runs before any schedule is built."""
    from omegaconf import OmegaConf

    from mtrain.config import FitConfig
    from mtrain.config_checks import check_config

    cfg = OmegaConf.structured(FitConfig)
    cfg.train.scheduler = "cosine"
    with pytest.raises(MtrainError, match="train.scheduler: cosine needs a horizon: set train.decay_updates"):
        check_config(cfg)
    cfg.train.max_updates = 100
    check_config(cfg)


def simulated_run(cfg: TrainConfig, seconds_per_update: float) -> list:
    """(progress, lr) of every update of a time-budgeted run on a machine of that speed,
    the clock advanced as the trainer does (progress before the update, then the step)."""
    schedule = LearningRateSchedule(cfg)
    budget = parse_duration(cfg.max_time)
    curve, seconds, update = [], 0.0, 0
    while seconds < budget:
        curve.append((seconds / budget, schedule.lr(update + 1, seconds / budget)))
        seconds += seconds_per_update
        update += 1
    return curve


@pytest.mark.parametrize("scheduler", ["linear", "cosine", "inverse_sqrt", "constant"])
def test_time_warmup_peaks_at_its_share_of_the_budget_at_any_update_rate(scheduler):
    cfg = TrainConfig(lr=1.5e-3, scheduler=scheduler, max_time="20m", warmup_time="9%", warmup_updates=300)
    # ~340 updates in 20 minutes (the slow AVX2 run of issue 16) and ~3,300 (the bf16 machine)
    slow, fast = simulated_run(cfg, 1200 / 340), simulated_run(cfg, 1200 / 3313)
    assert len(slow) < 400
    assert len(fast) > 3000
    for curve, step in ((slow, 1 / 340), (fast, 1 / 3313)):
        peak_progress, peak_lr = max(curve, key=lambda point: point[1])
        assert peak_lr == pytest.approx(1.5e-3, rel=step / 0.09 + 1e-9)
        assert abs(peak_progress - 0.09) <= step
        # the warmup ramps with time, not with updates: half the peak at half the warmup
        halfway = min(curve, key=lambda point: abs(point[0] - 0.045))
        assert halfway[1] == pytest.approx(1.5e-3 * halfway[0] / 0.09)
    if scheduler == "linear":
        assert slow[-1][1] < 1.5e-3 * 2 / 340 and fast[-1][1] < 1.5e-3 * 2 / 3313


def test_a_three_minute_run_reaches_the_peak_lr():
    cfg = TrainConfig(lr=1.5e-3, scheduler="linear", max_time="3m", warmup_time="9%", warmup_updates=300)
    curve = simulated_run(cfg, 1.0)  # one update per second: 180 updates, fewer than warmup_updates
    assert max(lr for _, lr in curve) == pytest.approx(1.5e-3, rel=0.07)


def test_warmup_time_as_a_duration_and_its_errors():
    cfg = TrainConfig(lr=1e-3, scheduler="linear", max_time="10m", warmup_time="60s")
    schedule = LearningRateSchedule(cfg)
    assert schedule.warmup_share == pytest.approx(0.1)
    assert schedule.lr(1, progress=0.05) == pytest.approx(5e-4)
    assert schedule.lr(1, progress=0.1) == pytest.approx(1e-3)
    assert schedule.lr(1, progress=0.55) == pytest.approx(5e-4)
    from omegaconf import OmegaConf

    from mtrain.config import FitConfig
    from mtrain.config_checks import check_config

    for bad in ("10m", "120%", "-1%", "soon", "x%"):  # refused by the checks before any schedule is built
        fit = OmegaConf.structured(FitConfig)
        fit.train.max_time, fit.train.warmup_time = "10m", bad
        with pytest.raises(MtrainError, match="train.warmup_time: .* must be a share of the training time"):
            check_config(fit)


def test_without_a_time_budget_warmup_time_gives_way_to_warmup_updates():
    cfg = TrainConfig(lr=1e-3, scheduler="linear", max_updates=1000, warmup_updates=100, warmup_time="9%")
    schedule = LearningRateSchedule(cfg)
    assert schedule.warmup_share is None
    assert schedule.lr(50) == pytest.approx(5e-4)


def test_a_larger_time_budget_at_resume_is_a_learning_rate_jump_that_is_reported():
    """The preset's linear decay with a 9% warmup: a finished 2-minute run resumed with
    max_time=3m is 2/3 through the 3-minute schedule (the issue's 8.0e-06 -> 5.5e-04)."""
    from mtrain.train.schedule import learning_rate_change, lr_at

    saved = TrainConfig(lr=1.5e-3, scheduler="linear", max_time="2m", warmup_time="9%", warmup_updates=300)
    grown = TrainConfig(lr=1.5e-3, scheduler="linear", max_time="3m", warmup_time="9%", warmup_updates=300)
    before, after = learning_rate_change(saved, grown, update=238, train_seconds=119.4)
    assert before == pytest.approx(lr_at(saved, 238, 119.4)) and before < 1e-5
    assert after == pytest.approx(1.5e-3 * (1 - (119.4 / 180 - 0.09) / 0.91))  # ~5.5e-04
    assert learning_rate_change(saved, saved, update=238, train_seconds=119.4) is None
    # An update budget grown the same way changes nothing: inverse-sqrt needs no horizon.
    by_updates = TrainConfig(lr=1e-3, scheduler="inverse_sqrt", max_updates=200)
    assert (
        learning_rate_change(
            by_updates, TrainConfig(lr=1e-3, scheduler="inverse_sqrt", max_updates=400), update=201, train_seconds=50.0
        )
        is None
    )
