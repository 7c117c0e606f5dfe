"""The confidence score (mtrain.decode.translation.confidence) and its calibration: isotonic and monotone,
within [0, 1], fitted from given (signal, chrF) pairs as worked out by hand, round-tripped
through JSON, refused in one line when a file is broken; the uncalibrated fallback; and
`mtrain fit` writing a run's confidence.json from its last validation's decodes."""

from __future__ import annotations

import json
import math
from itertools import pairwise

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mtrain.checkpoint.files import load_run
from mtrain.cli.fit import run_fit
from mtrain.config import DecodeConfig
from mtrain.decode import Hypothesis, translate_sentences
from mtrain.decode.translation.confidence import (
    UNCALIBRATED,
    Calibration,
    Confidence,
    fit_calibration,
    mean_log_prob,
    pool_adjacent_violators,
    read_calibration,
    run_confidence,
    write_calibration,
)
from mtrain.errors import MtrainError
from mtrain.evaluate.calibration import sentence_chrf
from mtrain.rundir import CONFIDENCE_FILE
from tests.fit_runs import TINY, compose_fit


def test_pool_adjacent_violators_pools_each_decrease_into_its_weighted_mean():
    assert pool_adjacent_violators([1.0, 2.0, 3.0], [1, 1, 1]) == [1.0, 2.0, 3.0]
    assert pool_adjacent_violators([3.0, 1.0, 2.0], [1, 1, 1]) == [2.0, 2.0, 2.0]
    # 1 then 0 with three times the weight: (1 * 1 + 0 * 3) / 4
    assert pool_adjacent_violators([1.0, 0.0, 0.5], [1, 3, 1]) == [0.25, 0.25, 0.5]


def test_fit_by_hand_one_pair_per_bin_and_two_per_bin():
    signals = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    targets = [0.1, 0.3, 0.2, 0.5, 0.4, 0.9]
    six = fit_calibration(signals, targets, bins=6, fitted_on="hand")
    assert six.knots == (1.0, 2.0, 3.0, 4.0, 5.0, 6.0)
    assert six.values == pytest.approx((0.1, 0.25, 0.25, 0.45, 0.45, 0.9))
    assert six.fitted_on == "hand"
    three = fit_calibration(signals[::-1], targets[::-1], bins=3)  # the order of the pairs does not matter
    assert three.knots == (1.5, 3.5, 5.5)
    assert three.values == pytest.approx((0.2, 0.35, 0.65))
    assert three(2.5) == pytest.approx(0.275)  # linear between knots
    assert three(-100.0) == pytest.approx(0.2) and three(100.0) == pytest.approx(0.65)  # flat beyond
    assert three(float("nan")) == pytest.approx(0.2)
    assert three(float("-inf")) == pytest.approx(0.2)


def test_fit_keeps_equal_signals_in_one_bin_and_survives_a_single_signal():
    tied = fit_calibration([1.0, 1.0, 1.0, 2.0], [0.0, 0.3, 0.6, 1.0], bins=4)
    assert tied.knots == (1.0, 2.0)
    assert tied.values == pytest.approx((0.3, 1.0))
    flat = fit_calibration([-1.0, -1.0], [0.2, 0.4])
    assert flat(-1.0) == pytest.approx(0.3) and flat(5.0) == pytest.approx(0.3)
    with pytest.raises(MtrainError, match="at least 2"):
        fit_calibration([-1.0, float("nan")], [0.5, 0.5])


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(-20, 0, allow_nan=False),
            st.floats(-0.5, 1.5, allow_nan=False),  # chrF / 100, and out-of-range targets clipped
        ),
        min_size=2,
        max_size=300,
    ),
    st.integers(1, 40),
)
def test_any_fit_is_monotone_and_within_zero_and_one(pairs, bins):
    calibration = fit_calibration([s for s, _ in pairs], [t for _, t in pairs], bins=bins)
    assert len(calibration.knots) <= max(bins, 2)
    grid = np.linspace(-25, 5, 121)
    estimates = [calibration(float(x)) for x in grid]
    assert all(0.0 <= e <= 1.0 for e in estimates)
    assert all(b >= a for a, b in pairwise(estimates))


def test_calibration_round_trips_through_json(tmp_path):
    calibration = fit_calibration(
        np.linspace(-3, -0.1, 200), np.linspace(0.1, 0.9, 200) ** 2, bins=20, fitted_on="valid, 200 sentences"
    )
    path = tmp_path / CONFIDENCE_FILE
    write_calibration(path, calibration)
    record = json.loads(path.read_text())
    assert record["signal"] == "mean_log_prob" and len(record["knots"]) == 20
    again = read_calibration(path)
    assert again.fitted_on == "valid, 200 sentences"
    for x in np.linspace(-4, 0, 41):
        assert again(float(x)) == pytest.approx(calibration(float(x)), abs=1e-6)
    assert run_confidence(tmp_path).calibration == again


def test_broken_files_are_refused_in_one_line_naming_the_file(tmp_path):
    path = tmp_path / CONFIDENCE_FILE
    path.write_text("{not json")
    with pytest.raises(MtrainError, match=rf"{CONFIDENCE_FILE}: cannot read .*; refit it"):
        read_calibration(path)
    path.write_text(json.dumps({"signal": "mean_log_prob", "knots": [-2, -1], "values": [0.6, 0.4]}))
    with pytest.raises(MtrainError, match=r"must not decrease .*; refit it"):
        read_calibration(path)
    path.write_text(json.dumps({"signal": "agreement", "knots": [-2, -1], "values": [0.4, 0.6]}))
    with pytest.raises(MtrainError, match="signal 'agreement' is not one this version computes"):
        read_calibration(path)


def test_confidence_is_calibrated_when_the_run_has_a_file_else_the_exp_of_the_signal(tmp_path):
    assert mean_log_prob(-6.0, 2) == pytest.approx(-2.0)  # EOS counted: 3 tokens
    uncalibrated = run_confidence(tmp_path)
    assert not uncalibrated.calibrated and uncalibrated.source == UNCALIBRATED
    assert uncalibrated.score(-6.0, 2) == pytest.approx(math.exp(-2.0))
    assert uncalibrated.score(0.0, 0) == 1.0 and uncalibrated.score(float("nan"), 3) == 0.0
    write_calibration(tmp_path / CONFIDENCE_FILE, Calibration((-3.0, -1.0), (0.2, 0.6), fitted_on="valid"))
    calibrated = run_confidence(tmp_path)
    assert calibrated.calibrated and calibrated.source.startswith("calibrated on valid:")
    assert calibrated.score(-6.0, 2) == pytest.approx(0.4)
    assert Confidence(None).score(-6.0, 2) == uncalibrated.score(-6.0, 2)
    assert calibrated.of(Hypothesis(tokens=[5, 6], score=-2.0, log_prob=-6.0)) == pytest.approx(0.4)


@pytest.mark.slow
def test_fit_writes_the_calibration_of_its_last_validation_decode(tmp_path, multi30k_slice, caplog):
    """The run validates once, at its end (its best.pt is what was validated): the file holds
    the isotonic fit of best.pt's greedy decode of the validation split, fp32, as re-decoded here."""
    run_dir = tmp_path / "run"
    overrides = [
        f"data.local_dir={multi30k_slice}",
        f"data.cache_dir={tmp_path / 'cache'}",
        *TINY,
        "data.train_limit=500",
        "train.max_updates=20",
        "train.validate_every=1000",
        "data.splits.test=null",
    ]
    with caplog.at_level("INFO", logger="mtrain"):
        metrics = run_fit(compose_fit(overrides), run_dir)
    assert metrics["finished"]
    calibration = read_calibration(run_dir / CONFIDENCE_FILE)
    assert calibration.fitted_on == "data.splits.valid=val, beam 1: 100 sentences"
    assert f"confidence: {CONFIDENCE_FILE} fitted on data.splits.valid=val, beam 1: 100 sentences" in caplog.text

    loaded = load_run(run_dir, device="cpu")
    sources = (run_dir / "data" / "valid.src").read_text().splitlines()
    references = (run_dir / "data" / "valid.ref").read_text().splitlines()
    cfg = DecodeConfig(beam=1, max_len_a=1.2, max_len_b=5)
    with torch.inference_mode():
        best = [hyps[0] for hyps in translate_sentences(loaded.model, loaded.tokenizer, sources, cfg, "cpu")]
    expected = fit_calibration(
        [mean_log_prob(h.log_prob, len(h.tokens)) for h in best],
        [c / 100 for c in sentence_chrf([h.text for h in best], references)],
    )
    assert calibration.knots == pytest.approx(expected.knots, abs=1e-5)
    assert calibration.values == pytest.approx(expected.values, abs=1e-5)
