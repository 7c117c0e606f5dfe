"""train.ema_decay: the average follows its formula exactly, resumes bit for bit, validates
and decodes, and `weights=` chooses between it and the trained weights."""

from __future__ import annotations

import json

import pytest
import torch

from mtrain.checkpoint.files import decode_weights, load_run
from mtrain.cli.fit import run_fit
from mtrain.config import ModelConfig
from mtrain.errors import MtrainError
from mtrain.evaluate.average import average_checkpoints
from mtrain.model import build_model
from mtrain.train.ema import WeightAverage
from mtrain.train.setup import setup_fit
from tests.fit_runs import TINY, check_resume_is_exact, compose_fit, mtrain


def tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(
        ModelConfig(encoder_layers=1, decoder_layers=1, d_model=16, heads=2, ffn_dim=32), 40, 40, 1, joint_vocab=True
    )


def reference_average(snapshots, decay, start_update=0):
    """The formula, one tensor at a time: snapshots[0] the initial weights, [n] after update n."""
    average = [t.clone() for t in snapshots[0]]
    for update, weights in enumerate(snapshots[1:], start=1):
        k = update - 1 - start_update
        d = 0.0 if k < 0 else min(decay, (1 + k) / (10 + k))
        average = [torch.lerp(a, w, 1.0 - d) for a, w in zip(average, weights, strict=True)]
    return average


def test_decay_warms_up_and_is_a_copy_before_the_start():
    ema = WeightAverage(tiny_model(), decay=0.999, start_update=3)
    assert [ema.decay_at(n) for n in (1, 2, 3)] == [0.0, 0.0, 0.0]
    assert ema.decay_at(4) == pytest.approx(0.1)
    assert ema.decay_at(5) == pytest.approx(2 / 11)
    assert ema.decay_at(100_000) == 0.999


@pytest.mark.parametrize("start_update", [0, 4])
def test_the_average_after_n_updates_equals_the_formula_exactly(start_update):
    model = tiny_model()
    ema = WeightAverage(model, decay=0.9, start_update=start_update)
    snapshots = [[p.detach().clone() for p in model.parameters()]]
    generator = torch.Generator().manual_seed(1)
    for update in range(1, 31):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=generator) * 0.1)
        ema.update(update)
        snapshots.append([p.detach().clone() for p in model.parameters()])
    expected = reference_average(snapshots, 0.9, start_update)
    got = list(ema.module.parameters())
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    # and it is the weighted mean the recursion stands for (float64, up to rounding)
    weights, mean = [], None
    for n in range(30, -1, -1):  # weight of snapshot n: (1 - d_n) * prod_{m > n} d_m
        d_n = 1.0 if n == 0 else ema.decay_at(n)
        later = 1.0
        for m in range(n + 1, 31):
            later *= ema.decay_at(m)
        weights.append((n, (1.0 - d_n if n else 1.0) * later))
    mean = sum(w * snapshots[n][0].double() for n, w in weights)
    assert torch.allclose(got[0].double(), mean, atol=1e-6)
    assert sum(w for _, w in weights) == pytest.approx(1.0)
    assert not any(p.requires_grad for p in ema.module.parameters())


def fit_overrides(slice_dir, tmp_path, *extra):
    return [
        f"data.local_dir={slice_dir}",
        f"data.cache_dir={tmp_path / 'cache'}",
        *TINY,
        "train.log_every=1",
        "train.valid_bleu=false",
        "data.train_limit=600",
        *extra,
    ]


def test_training_updates_the_average_of_the_trained_weights(tmp_path, multi30k_slice):
    cfg = compose_fit(fit_overrides(multi30k_slice, tmp_path, "train.ema_decay=0.95", "train.max_updates=8"))
    setup = setup_fit(cfg)
    model, ema = setup.model, setup.trainer.parts.ema
    snapshots = [[p.detach().clone() for p in model.parameters()]]
    for _ in range(8):
        assert setup.trainer.run_update() is not None
        snapshots.append([p.detach().clone() for p in model.parameters()])
    expected = reference_average(snapshots, 0.95)
    assert all(torch.equal(a, b) for a, b in zip(ema.module.parameters(), expected, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(ema.module.parameters(), model.parameters(), strict=True))


def test_the_average_leaves_training_as_it_was(tmp_path, multi30k_slice):
    """EMA on or off, the trained weights are the same bits: the raw weights of an EMA run are
    the run without it (what docs/PERFORMANCE.md's comparison relies on)."""
    finals = []
    for decay in ("null", "0.9"):
        setup = setup_fit(
            compose_fit(fit_overrides(multi30k_slice, tmp_path, f"train.ema_decay={decay}", "train.max_updates=6"))
        )
        for _ in range(6):
            setup.trainer.run_update()
        finals.append([p.detach().clone() for p in setup.model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*finals, strict=True))


def test_a_resumed_run_has_the_same_average_bit_for_bit(tmp_path, multi30k_slice):
    common = fit_overrides(multi30k_slice, tmp_path, "train.validate_every=6", "train.ema_decay=0.9")
    straight, interrupted, summary = check_resume_is_exact(common, tmp_path)
    a = torch.load(straight / "checkpoints" / "last.pt", weights_only=True)
    b = torch.load(interrupted / "checkpoints" / "last.pt", weights_only=True)
    assert a["decode_weights"] == "ema" and a["ema_decay"] == 0.9
    assert all(torch.equal(a["ema"][k], b["ema"][k]) for k in a["ema"])
    assert not all(torch.equal(a["ema"][k], a["model"][k]) for k in a["model"] if a["model"][k].is_floating_point())
    # validation judged the average and logged the trained weights' loss beside it
    assert "raw_ppl" in summary["valid"] and summary["valid"]["ppl"] != summary["valid"]["raw_ppl"]
    best = torch.load(straight / "checkpoints" / "best.pt", weights_only=True)
    assert "ema" in best and "optimizer" not in best
    assert summary["test"]["weights"] == "ema"


@pytest.fixture(scope="module")
def ema_run(tmp_path_factory, multi30k_slice):
    tmp_path = tmp_path_factory.mktemp("ema")
    run_fit(
        compose_fit(
            fit_overrides(
                multi30k_slice, tmp_path, "train.ema_decay=0.9", "train.max_updates=10", "train.validate_every=5"
            )
        ),
        tmp_path / "run",
    )
    return tmp_path / "run"


def test_decoding_takes_the_average_unless_told_weights_raw(ema_run):
    state = torch.load(ema_run / "checkpoints" / "best.pt", weights_only=True)
    for weights, key in (("auto", "ema"), ("ema", "ema"), ("raw", "model")):
        loaded = load_run(ema_run, which="best", weights=weights)
        assert loaded.weights == ("raw" if key == "model" else "ema")
        assert all(torch.equal(v, state[key][k]) for k, v in loaded.model.state_dict().items())
    without = {k: v for k, v in state.items() if k != "ema"}
    assert decode_weights(without, ema_run)[1] == "raw"
    with pytest.raises(MtrainError, match="no average of the weights"):
        decode_weights(without, ema_run, "ema")


def test_translate_says_which_weights_and_refuses_ema_of_a_run_without(ema_run, tmp_path):
    source = tmp_path / "in.de"
    source.write_text("Ein Mann fährt Fahrrad.\n", encoding="utf-8")
    ok = mtrain("translate", f"run={ema_run}", f"input={source}", "decode.beam=2")
    assert ok.returncode == 0, ok.stderr
    assert "EMA weights" in ok.stderr
    raw = mtrain("translate", f"run={ema_run}", f"input={source}", "decode.beam=2", "weights=raw")
    assert raw.returncode == 0 and "EMA weights" not in raw.stderr
    assert mtrain("translate", f"run={ema_run}", f"input={source}", "weights=mean").returncode == 2


def test_averaging_checkpoints_averages_both_weights(ema_run):
    paths = sorted((ema_run / "checkpoints").glob("update_*.pt"))
    assert len(paths) == 2
    states = [torch.load(p, weights_only=True) for p in paths]
    averaged = average_checkpoints(paths)
    for key in ("model", "ema"):
        name = next(k for k, v in states[0][key].items() if v.is_floating_point())
        expected = ((states[0][key][name].double() + states[1][key][name].double()) / 2).to(states[0][key][name].dtype)
        assert torch.equal(averaged[key][name], expected), key


def test_ema_decay_out_of_range_is_one_line(tmp_path):
    result = mtrain("fit", "train.ema_decay=1.5", f"hydra.run.dir={tmp_path / 'r'}")
    assert result.returncode == 2
    assert "train.ema_decay" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "r").exists()


def test_metrics_record_the_test_weights(ema_run):
    metrics = json.loads((ema_run / "metrics.json").read_text())
    assert metrics["test"]["weights"] == "ema"
    assert "raw_ppl" in metrics["valid"]
