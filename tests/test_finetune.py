"""`init_from` (mtrain/train/init_from.py): a new run from another run's weights and tokenizer.

One tiny Multi30k parent (EMA kept, target-restricted softmax) and one fine-tune of it on TED
pairs (IWSLT14 valid_detok_lc, validated on tst2013) are shared by the module's tests.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from mtrain.checkpoint.files import load_checkpoint, load_run
from mtrain.cli.fit import run_fit
from mtrain.config import with_resolved_model
from mtrain.config_checks import check_config
from mtrain.errors import MtrainError
from mtrain.rundir import RunDir
from mtrain.tokenizer import Tokenizer
from mtrain.train.init_from import FREE_MODEL_KEYS, explicit_keys, inherited_config, load_parent
from mtrain.train.setup import build_fit, prepare_fit_data, resolve_machine
from tests.conftest import write_head
from tests.fit_runs import QUICK, compose_fit, mtrain, one_error_line, scalars, snapshot


@pytest.fixture(scope="module")
def ted(tmp_path_factory, data_dir) -> Path:
    """200 TED training pairs (lowercased, as the issue's domain-adaptation data) and 30 of
    tst2013 to validate on, in the `{split}.{lang}` layout."""
    out = tmp_path_factory.mktemp("ted")
    for lang in ("de", "en"):
        for name, split, count in (("valid_detok_lc", "train", 200), ("tst2013", "val", 30)):
            write_head(data_dir / "iwslt14_de_en" / f"{name}.{lang}.gz", out / f"{split}.{lang}", count)
    return out


def child_overrides(parent: Path, ted: Path, cache: Path, *more: str) -> list:
    return [
        f"init_from={parent}",
        f"data.local_dir={ted}",
        f"data.cache_dir={cache}",
        *QUICK,
        "train.validate_every=2",
        "train.max_updates=4",
        *more,
    ]


def fine_tune(overrides: list, run_dir: Path) -> dict:
    """`mtrain fit` in this process, the overrides also as its command line (what Hydra hands on)."""
    return run_fit(compose_fit(overrides), run_dir, command_line=overrides)


@pytest.fixture(scope="module")
def child(tmp_path_factory, parent, ted) -> tuple:
    """A fine-tune of `parent` on TED with a fresh cache (so a trained tokenizer would show),
    dropout raised; returns (its overrides, its run directory, its cache)."""
    base = tmp_path_factory.mktemp("child")
    overrides = child_overrides(parent, ted, base / "cache", "model.dropout=0.2")
    fine_tune(overrides, base / "run")
    return overrides, base / "run", base / "cache"


def built(overrides: list, parent_path: Path, weights: str = "auto", keep_optimizer: bool = False):
    """What `mtrain fit` builds for a fine-tune, before its first update."""
    cfg = with_resolved_model(compose_fit(overrides))
    parent = load_parent(str(parent_path), weights, keep_optimizer, cfg.data)
    cfg = inherited_config(cfg, parent.config, overrides, "init_from")
    machine = resolve_machine(cfg)
    data = prepare_fit_data(cfg, machine, progress=lambda *_: None, tokenizer=parent.tokenizer)
    return build_fit(cfg, machine, data, init=parent), data


@pytest.mark.parametrize("weights", ["ema", "raw"])
def test_the_parent_weights_load_bit_exactly_and_the_softmax_keeps_its_pieces(parent, ted, tmp_path, weights):
    overrides = child_overrides(parent, ted, tmp_path / "cache", f"init_weights={weights}")
    setup, data = built(overrides, parent, weights)
    best = load_checkpoint(RunDir(parent).checkpoint("best"))
    expected = best["ema" if weights == "ema" else "model"]
    other = best["model" if weights == "ema" else "ema"]
    loaded = setup.model.state_dict()
    assert loaded.keys() == expected.keys()
    for key in expected:
        if key != "output_allowed":
            assert loaded[key].dtype == expected[key].dtype and torch.equal(loaded[key], expected[key]), key
    assert any(not torch.equal(expected[key], other[key]) for key in expected)  # the choice mattered
    # the softmax: the parent's pieces, those of the new training targets, eos and unk
    parent_pieces = torch.nonzero(expected["output_allowed"]).flatten().numpy()
    new_pieces = data.train.target_pieces()
    union = np.union1d(np.union1d(parent_pieces, new_pieces), [data.tokenizer.eos_id, data.tokenizer.unk_id])
    assert torch.nonzero(loaded["output_allowed"]).flatten().tolist() == union.tolist()
    assert len(union) > len(parent_pieces)  # the new domain's pieces join...
    assert len(union) > len(
        np.union1d(new_pieces, [data.tokenizer.eos_id, data.tokenizer.unk_id])
    )  # ...the parent's stay
    # a fresh optimiser without init_keep_optimizer
    assert not setup.trainer.optimizer.state


def test_init_keep_optimizer_takes_adam_s_moments_from_last_pt_under_the_new_settings(parent, ted, tmp_path):
    last = RunDir(parent).checkpoint("last")
    overrides = child_overrides(
        last, ted, tmp_path / "cache", "init_keep_optimizer=true", "train.lr=1e-4", "train.betas=[0.8,0.9]"
    )
    setup, _ = built(overrides, last, keep_optimizer=True)
    saved = load_checkpoint(last)["optimizer"]
    optimizer = setup.trainer.optimizer
    state = optimizer.state_dict()["state"]
    assert state.keys() == saved["state"].keys() and len(state) == len(list(setup.model.parameters()))
    for index, moments in saved["state"].items():
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(state[index][name], moments[name]), (index, name)
    assert optimizer.param_groups[0]["betas"] == (0.8, 0.9)  # the new run's hyperparameters, not the parent's
    assert tuple(saved["param_groups"][0]["betas"]) == (0.9, 0.98)


def test_a_fine_tune_reuses_the_parent_tokenizer_and_model_and_records_its_parent(parent, child):
    _, run_dir, cache = child
    parent_run, run = RunDir(parent), RunDir(run_dir)
    assert Tokenizer.load(run.tokenizer_dir).fingerprint == Tokenizer.load(parent_run.tokenizer_dir).fingerprint
    assert not (cache / "tokenizers").exists()  # no tokenizer trained for the TED data
    assert (cache / "corpora").is_dir()  # ...which was encoded with the parent's
    config, parent_config = (yaml.safe_load(r.config_file.read_text()) for r in (run, parent_run))
    assert config["tokenizer"] == parent_config["tokenizer"]
    assert config["model"] == {**parent_config["model"], "dropout": 0.2}
    assert config["init_from"] == str(parent)
    best = parent_run.checkpoint("best")
    lineage = yaml.safe_load(run.parent_file.read_text())
    assert lineage["sha256"] == hashlib.sha256(best.read_bytes()).hexdigest()
    assert (lineage["checkpoint"], lineage["from"], lineage["update"]) == (
        str(best.resolve()),
        str(parent.resolve()),
        2,
    )
    assert (lineage["weights"], lineage["keep_optimizer"]) == ("ema", False)
    assert lineage["config"] == load_checkpoint(best)["config"]
    assert json.loads(run.metrics_file.read_text())["init"] == lineage
    assert load_checkpoint(run.checkpoint("last"))["init"] == lineage
    # translate/eval/export open it as any run
    loaded = load_run(run_dir)
    assert loaded.config.init_from == str(parent) and loaded.config.model.d_model == 32
    assert all(
        torch.equal(value, load_checkpoint(run.checkpoint("best"))["model"][key])
        for key, value in loaded.model.state_dict().items()
    )


def test_a_resumed_fine_tune_continues_its_own_run_exactly_without_its_parent(parent, ted, child, tmp_path):
    _overrides, straight, _ = child
    moved_parent = tmp_path / "parent"
    shutil.copytree(parent, moved_parent)
    interrupted = tmp_path / "run"
    common = child_overrides(moved_parent, ted, tmp_path / "cache", "model.dropout=0.2")
    fine_tune([*common, "train.max_updates=2"], interrupted)
    shutil.rmtree(moved_parent)  # a resume never reads the parent again
    resume = [o for o in common if not o.startswith("init_from=")] + ["train.resume=true"]
    fine_tune(resume, interrupted)
    expected, resumed = scalars(straight, "train/loss"), scalars(interrupted, "train/loss")
    assert [resumed[update] for update in (3, 4)] == [expected[update] for update in (3, 4)]
    final, reference = (load_checkpoint(RunDir(r).checkpoint("last"))["model"] for r in (interrupted, straight))
    assert all(torch.equal(final[key], reference[key]) for key in reference)
    config = yaml.safe_load(RunDir(interrupted).config_file.read_text())
    assert config["init_from"] == str(moved_parent) and config["model"]["dropout"] == 0.2
    assert json.loads(RunDir(interrupted).metrics_file.read_text())["init"]["from"] == str(moved_parent)


def without_tokenizer(parent: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "no_tokenizer"
    shutil.copytree(parent, copy)
    shutil.rmtree(copy / "tokenizer")
    return copy


def not_a_checkpoint(parent: Path, tmp_path: Path) -> Path:
    return parent / "config.yaml"


def not_a_run(parent: Path, tmp_path: Path) -> Path:
    return parent / "tokenizer"


@pytest.mark.parametrize(
    "make_parent, more, message",
    [
        (not_a_run, [], "no checkpoints in"),
        (not_a_checkpoint, [], "not a loadable mtrain checkpoint"),
        (without_tokenizer, [], "the parent run has no tokenizer/"),
        (None, ["model.d_model=64"], "model.d_model=64: the weights of init_from="),
        (None, ["model.heads=4"], "have model.heads=2"),
        (None, ["tokenizer.vocab_size=500"], "tokenizer.vocab_size=500: init_from="),
        (None, ["init_keep_optimizer=true"], "best.pt holds no optimiser state"),
        (None, ["data.lang_tags=true"], "has no piece <2en>"),
    ],
)
def test_a_bad_parent_or_misfit_is_refused_before_anything_is_written(
    parent, ted, tmp_path, make_parent, more, message
):
    source = make_parent(parent, tmp_path) if make_parent else parent
    before = snapshot(parent)
    run_dir = tmp_path / "new"
    with pytest.raises(MtrainError, match=message) as refused:
        fine_tune(child_overrides(source, ted, tmp_path / "cache", *more), run_dir)
    assert "\n" not in str(refused.value)
    assert not run_dir.exists()
    assert not (tmp_path / "cache").exists()  # refused before the data was read
    assert snapshot(parent) == before


def test_init_from_on_a_run_with_checkpoints_is_refused_saying_which_to_use(parent, ted, child, tmp_path):
    overrides, run_dir, _ = child
    before = snapshot(run_dir)
    result = mtrain("fit", *overrides, "train.resume=true", f"hydra.run.dir={run_dir}")
    assert result.returncode == 2
    line = one_error_line(result)
    assert "already has checkpoints" in line and "without init_from" in line and "new hydra.run.dir" in line
    assert snapshot(run_dir) == before


def test_prepare_with_init_from_encodes_with_the_parent_tokenizer_what_fit_reuses(child):
    overrides, _, cache = child
    result = mtrain("prepare", *overrides)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "tokenizer: the given one" in result.stdout and "data: cache hit" in result.stdout
    assert not (cache / "tokenizers").exists()


def test_a_fine_tune_stopped_before_its_first_checkpoint_is_not_resumed_from_scratch(parent, ted, child, tmp_path):
    overrides, run_dir, _ = child
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    shutil.rmtree(copy / "checkpoints")
    before = snapshot(copy)
    resume = [o for o in overrides if not o.startswith("init_from=")] + ["train.resume=true"]
    with pytest.raises(MtrainError, match=f"this run started from init_from={parent.resolve()}"):
        fine_tune(resume, copy)
    assert snapshot(copy) == before


def test_init_keys_are_checked_before_the_run():
    for overrides, message in (
        (["init_from=/no/such/run"], "init_from: '/no/such/run': no such run directory"),
        (["init_keep_optimizer=true"], "init_keep_optimizer: true needs init_from"),
        (["init_weights=ema"], "init_weights: ema chooses the weights of init_from"),
    ):
        with pytest.raises(MtrainError, match=message):
            check_config(compose_fit(overrides))


def test_explicit_keys_read_the_command_line():
    line = [
        "model.dropout=0.3",
        "+model.attention_dropout=0.1",
        "~model.x",
        "data.src=de",
        "model=transformer_base",
        "tokenizer.vocab_size=8",
    ]
    assert explicit_keys(line, "model") == ["dropout", "attention_dropout", "x", ""]
    assert explicit_keys(line, "tokenizer") == ["vocab_size"]
    assert "dropout" in FREE_MODEL_KEYS and "d_model" not in FREE_MODEL_KEYS
