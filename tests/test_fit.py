"""`mtrain fit` end to end on a slice of real Multi30k data, resume exactness, config errors."""

from __future__ import annotations

import json
import re
import time

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

from mtrain.checkpoint.files import load_run
from mtrain.cli.common import CONFIG_DIR
from mtrain.cli.fit import run_fit
from mtrain.errors import MtrainError
from mtrain.wording import counted
from tests.conftest import test_threads
from tests.fit_runs import BUDGET_MARGIN_S, TINY, check_resume_is_exact, compose_fit, mtrain, scalars


@pytest.mark.slow
def test_fit_end_to_end_writes_every_artifact(tmp_path, multi30k_slice):
    run_dir = tmp_path / "run"
    result = mtrain(
        "fit",
        f"data.local_dir={multi30k_slice}",
        f"data.cache_dir={tmp_path / 'cache'}",
        *TINY,
        "train.max_updates=60",
        "train.validate_every=30",
        "train.log_every=10",
        "train.loss_every=10",
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for artifact in (
        "config.yaml",
        ".hydra/config.yaml",
        ".hydra/overrides.yaml",
        "tokenizer",
        "checkpoints/last.pt",
        "checkpoints/best.pt",
        "checkpoints/update_60.pt",
        "train.log",
        "metrics.json",
        "eval/test.hyp",
        "confidence.json",  # the confidence score's calibration, from the last validation's decodes
    ):
        assert (run_dir / artifact).exists(), artifact
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["updates"] == 60
    # Only last.pt carries the optimiser's state (what a resume needs); the others hold the weights.
    checkpoints = {
        name: torch.load(run_dir / "checkpoints" / f"{name}.pt", weights_only=True)
        for name in ("last", "best", "update_60")
    }
    assert "optimizer" in checkpoints["last"]
    assert "optimizer" not in checkpoints["best"] and "optimizer" not in checkpoints["update_60"]
    assert all(
        torch.equal(checkpoints["last"]["model"][k], checkpoints["update_60"]["model"][k])
        for k in checkpoints["last"]["model"]
    )
    sizes = {name: (run_dir / "checkpoints" / f"{name}.pt").stat().st_size for name in checkpoints}
    assert sizes["update_60"] < 0.5 * sizes["last"]
    assert metrics["disk_use_mb"]["checkpoints"] == pytest.approx(  # best.pt, a hard link, counted once
        sum({p.stat().st_ino: p.stat().st_size for p in (run_dir / "checkpoints").iterdir()}.values()) / 1e6, abs=0.1
    )
    assert metrics["disk_use_mb"]["total"] >= metrics["disk_use_mb"]["checkpoints"]
    assert 0.0 <= metrics["test"]["bleu"] <= 100.0
    assert metrics["test"]["bleu_signature"].startswith("nrefs:1")
    assert len((run_dir / "eval" / "test.hyp").read_text().splitlines()) == 100
    for tag in ("train/loss", "train/lr", "train/grad_norm", "train/tgt_tokens_per_s", "valid/loss", "valid/bleu"):
        assert scalars(run_dir, tag), tag
    train_log = (run_dir / "train.log").read_text()
    assert "valid | update 60" in train_log and "test |" in train_log
    # Trained at train.num_threads=N (TINY's), decoded as `mtrain eval` decodes: 1 thread, whatever the load.
    assert json.loads((run_dir / "eval" / "test.json").read_text())["decode"]["threads"] == 1
    threads = test_threads()
    assert (
        f"training with {threads} CPU thread{'' if threads == 1 else 's'} (train.num_threads={threads}); "
        "validation and the test decode with 1 CPU thread, the default (train.decode_num_threads=N to choose)"
    ) in train_log
    # The loss went down: the pipeline actually learns.
    losses = scalars(run_dir, "train/loss")
    assert losses[60] < losses[10]


@pytest.mark.slow
def test_max_time_is_the_wall_time_of_the_whole_run_validation_and_test_included(tmp_path, multi30k_slice):
    """The command, from its start to its exit, takes train.max_time plus a margin: the time before
    training, the last validation and the test decode come out of the budget, not on top of it.
    Its log says what the budget covers and shows the validation and test decodes' progress in
    the (non-terminal) log. (Training lines by time: tests/test_trainer.py.)"""
    run_dir = tmp_path / "run"
    start = time.monotonic()
    result = mtrain(
        "fit",
        f"data.local_dir={multi30k_slice}",
        f"data.cache_dir={tmp_path / 'cache'}",
        *TINY,
        "train.max_time=30s",
        "train.validate_every=100000",  # validate once, at the end, as the CPU preset does
        "train.log_every=100000",
        "train.log_every_time=0.1s",
        "decode.max_tokens=200",  # decodes of several batches (about 7 and 3 sentences): progress between them
        f"hydra.run.dir={run_dir}",
        new_interpreter=True,  # the budget counts the interpreter's start (imports) too
    )
    wall = time.monotonic() - start
    if result.returncode == 2 and "which leaves no time to train" in result.stderr:
        # Start-up on cores other jobs keep busy (load 10 on 2 cores: 23 s of it) left nothing to
        # train: refused before the first update, as it should be, but nothing more to check here
        # (its wall time is that start-up's, which no budget can shorten).
        pytest.skip(result.stderr.strip().splitlines()[-1])
    assert wall <= 30 + BUDGET_MARGIN_S, wall
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["stop_reason"] == "max_time=30s reached" and metrics["updates"] >= 1
    assert metrics["train_time_s"] < 30
    if "test_skipped" in metrics:
        # Under load the test decode's measured time can be over what is left: skipped or stopped
        # with one line (mtrain.cli.fit_scoring), never run past the budget; nothing more to check.
        pytest.skip(metrics["test_skipped"])
    assert metrics["test"]["sentences"] == 100
    train_log = (run_dir / "train.log").read_text()
    assert re.search(
        r"budget: max_time=30s for the whole run: \d+ s spent before training .*, \d+ s of training", train_log
    )
    # TINY trains with test_threads() threads: 1 under two xdist workers on 2 cores, 2 alone.
    assert train_log.count(f"training with {counted(test_threads(), 'CPU thread')}") == 1
    assert "valid | decoded " in train_log and "test | decoded " in train_log
    assert re.search(r"test \| decoded \d+/100 sentences \| [\d.]+ sentences/s \| ~\d+ s left", train_log)
    assert "wall time of the run: " in train_log


def test_resume_continues_exactly(tmp_path, multi30k_slice):
    # output_vocab=target (the presets' softmax); the default full softmax resumes exactly in
    # test_faults (ten kills), test_ema and test_subword_sampling.
    common = [
        f"data.local_dir={multi30k_slice}",
        f"data.cache_dir={tmp_path / 'cache'}",
        *TINY,
        "train.log_every=1",
        "train.valid_bleu=false",
        "train.validate_every=6",
        "data.train_limit=600",
        "model.output_vocab=target",
        "data.splits.test=null",
    ]
    straight, interrupted, _ = check_resume_is_exact(common, tmp_path)
    a = torch.load(straight / "checkpoints" / "last.pt", weights_only=True)["model"]
    b = torch.load(interrupted / "checkpoints" / "last.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the softmax ranges over the pieces of the (600) training targets, eos and unk,
    # and a run loaded for decoding keeps that restriction
    from mtrain.batches import prepare_data

    cfg = compose_fit(common)
    data = prepare_data(cfg.data, cfg.tokenizer, log=lambda *_: None)
    expected = np.union1d(data.train.target_pieces(), [data.tokenizer.eos_id, data.tokenizer.unk_id])
    loaded = load_run(interrupted, which="last")
    assert loaded.model.output_ids.tolist() == expected.tolist()
    assert len(expected) < data.tokenizer.tgt_vocab_size


def test_a_run_on_a_given_tokenizer_keeps_a_copy_and_resumes_without_the_original(tmp_path, multi30k_slice):
    import shutil

    common = [
        f"data.local_dir={multi30k_slice}",
        f"data.cache_dir={tmp_path / 'cache'}",
        *TINY,
        "train.valid_bleu=false",
        "data.train_limit=300",
        "data.splits.test=null",
    ]
    run_fit(compose_fit(common + ["train.max_updates=2"]), tmp_path / "first")
    shutil.copytree(tmp_path / "first" / "tokenizer", tmp_path / "given")
    given = common + [f"tokenizer.path={tmp_path / 'given'}", "tokenizer.vocab_size=999"]  # its files rule
    run_fit(compose_fit(given + ["train.max_updates=2"]), tmp_path / "second")
    for path in (tmp_path / "given").iterdir():
        assert (tmp_path / "second" / "tokenizer" / path.name).read_bytes() == path.read_bytes()
    shutil.rmtree(tmp_path / "given")  # the origin is gone: the run encodes with its own copy
    metrics = run_fit(compose_fit(given + ["train.max_updates=4", "train.resume=true"]), tmp_path / "second")
    assert metrics["updates"] == 4


def test_a_run_says_what_ran_in_provenance_json_one_entry_per_session(tmp_path, multi30k_slice, caplog):
    """Issue 59: the code, versions, command line and data fingerprints are readable in the run
    directory from its start; a resume appends its session; the log names the cache entries."""
    import logging

    from mtrain.provenance import code_version

    common = [
        f"data.local_dir={multi30k_slice}",
        f"data.cache_dir={tmp_path / 'cache'}",
        *TINY,
        "train.valid_bleu=false",
        "data.train_limit=300",
        "data.splits.test=null",
    ]
    run_dir = tmp_path / "run"
    run_fit(compose_fit([*common, "train.max_updates=2"]), run_dir, command_line=["train.max_updates=2"])
    caplog.set_level(logging.INFO, logger="mtrain")
    resume = ["train.max_updates=3", "train.resume=true"]
    run_fit(compose_fit([*common, *resume]), run_dir, command_line=resume)

    sessions = json.loads((run_dir / "provenance.json").read_text())["sessions"]
    assert [(s["update"], s["resumed_from"]) for s in sessions] == [
        (0, None),
        (2, str(run_dir / "checkpoints" / "last.pt")),
    ]
    assert [s["command"]["overrides"] for s in sessions] == [["train.max_updates=2"], resume]
    assert all(s["code"] == code_version() for s in sessions)
    assert {"mtrain", "torch", "python"} <= set(sessions[0]["versions"])
    checkpoint = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert sessions[0]["data"]["fingerprints"] == sessions[1]["data"]["fingerprints"] == checkpoint["data_fingerprints"]
    # The cache entries read, as the log names them (their names end in their cache key).
    corpus_entry = sessions[1]["data"]["caches"]["training_corpora"][0]
    assert f"data: cache hit, reusing the encoded corpus in {corpus_entry} " in caplog.text
    assert f"tokenizer: reusing {sessions[1]['data']['caches']['tokenizer'][0]}" in caplog.text
    fingerprint = checkpoint["data_fingerprints"]["corpus"][:16]
    assert re.search(
        rf"provenance: code \S+.*, torch .*; training data {fingerprint}, tokenizer \w{{16}} \(provenance.json\)",
        caplog.text,
    )


def test_existing_run_directory_is_not_overwritten(tmp_path, multi30k_slice):
    common = [
        f"data.local_dir={multi30k_slice}",
        f"data.cache_dir={tmp_path / 'cache'}",
        *TINY,
        "train.valid_bleu=false",
        "data.train_limit=300",
        "train.max_updates=2",
    ]
    run_fit(compose_fit(common), tmp_path / "run")
    before = (tmp_path / "run" / "checkpoints" / "last.pt").read_bytes()
    with pytest.raises(MtrainError, match="train.resume=true"):
        run_fit(compose_fit(common), tmp_path / "run")
    assert (tmp_path / "run" / "checkpoints" / "last.pt").read_bytes() == before


def test_resume_with_incompatible_config_is_refused(tmp_path, multi30k_slice):
    common = [
        f"data.local_dir={multi30k_slice}",
        f"data.cache_dir={tmp_path / 'cache'}",
        *TINY,
        "train.valid_bleu=false",
        "data.train_limit=300",
        "train.max_updates=2",
    ]
    run_fit(compose_fit(common), tmp_path / "run")
    with pytest.raises(MtrainError, match="model.d_model=64"):
        run_fit(compose_fit(common + ["model.d_model=32", "train.resume=true"]), tmp_path / "run")


def test_unknown_config_key_fails_naming_it():
    result = mtrain("fit", "model.d_modle=512")
    assert result.returncode != 0
    assert "d_modle" in result.stderr
    assert "Traceback" not in result.stderr


def test_wrong_config_type_fails_naming_it():
    result = mtrain("fit", "train.lr=fast")
    assert result.returncode != 0
    assert "train.lr" in result.stderr or "lr" in result.stderr
    assert "Traceback" not in result.stderr
    assert "CPU thread" not in result.stdout + result.stderr  # nothing is said of threads before a refusal


def test_cli_help_and_cfg_job():
    top = mtrain("--help")
    assert top.returncode == 0
    for command in ("fit", "translate", "eval"):
        assert command in top.stdout
    job = mtrain("fit", "experiment=multi30k_cpu", "--cfg", "job")
    assert job.returncode == 0, job.stderr
    assert "max_train_time: 20m" in job.stdout and "d_model: 256" in job.stdout
    help_text = mtrain("fit", "--help")
    assert help_text.returncode == 0 and "experiment" in help_text.stdout


def test_missing_data_lists_what_was_tried(tmp_path):
    result = mtrain("fit", f"data.local_dir={tmp_path / 'nowhere'}", f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 2
    assert "nowhere" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_multirun_sweep_runs_each_value(tmp_path, multi30k_slice):
    sweep_dir = tmp_path / "sweep"
    result = mtrain(
        "fit",
        "-m",
        "model.layers=1,2",
        f"data.local_dir={multi30k_slice}",
        f"data.cache_dir={tmp_path / 'cache'}",
        *TINY,
        "train.max_updates=3",
        "train.valid_bleu=false",
        "data.train_limit=300",
        "data.splits.test=null",
        f"hydra.sweep.dir={sweep_dir}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for job in ("0", "1"):
        assert (sweep_dir / job / "metrics.json").exists()
    configs = [(sweep_dir / job / "config.yaml").read_text() for job in ("0", "1")]
    assert "encoder_layers: 1" in configs[0] and "encoder_layers: 2" in configs[1]


@pytest.mark.slow
def test_a_sweep_with_a_failing_job_runs_the_others_exits_non_zero_and_reports_it(tmp_path, multi30k_slice):
    sweep_dir = tmp_path / "sweep"
    result = mtrain(
        "fit",
        "-m",
        "model.max_positions=256,16,128",
        f"data.local_dir={multi30k_slice}",
        f"data.cache_dir={tmp_path / 'cache'}",
        *TINY,
        "train.max_updates=2",
        "train.valid_bleu=false",
        "data.train_limit=300",
        "data.splits.test=null",
        f"hydra.sweep.dir={sweep_dir}",
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1].startswith(
        "mtrain: error: 1 of 3 sweep jobs failed: job 1 (model.max_positions=16);"
    )
    assert (sweep_dir / "0" / "metrics.json").exists() and (sweep_dir / "2" / "metrics.json").exists()
    reason = json.loads((sweep_dir / "1" / "failed.json").read_text())["error"]
    assert "model.max_positions" in reason

    report = mtrain("report", str(sweep_dir), "bootstrap_samples=0")
    assert report.returncode == 0, report.stderr[-3000:]
    markdown = (sweep_dir / "report" / "report.md").read_text()
    assert "3 runs, 1 of them failed (see below)." in markdown
    assert f"- run 1 (model.max_positions=16) failed: {reason}" in markdown
    compared = mtrain("eval", f"runs={sweep_dir}")
    assert compared.returncode == 0, compared.stderr[-3000:]
    assert f"run 1 (model.max_positions=16) failed: {reason}" in compared.stdout


def test_fit_without_a_test_split(tmp_path, multi30k_slice):
    """data.splits.test=null: a smoke run spends nothing on a test decode, and says so."""
    run_dir = tmp_path / "run"
    metrics = run_fit(
        compose_fit(
            [
                f"data.local_dir={multi30k_slice}",
                f"data.cache_dir={tmp_path / 'cache'}",
                *TINY,
                "train.valid_bleu=false",
                "data.train_limit=300",
                "train.max_updates=2",
                "data.splits.test=null",
            ]
        ),
        run_dir,
    )
    assert metrics["finished"] and "test" not in metrics
    assert (run_dir / "data" / "valid.ref").is_file() and not (run_dir / "data" / "test.ref").exists()
    assert not (run_dir / "eval").exists()
    assert not (run_dir / "confidence.json").exists()  # no validation decode to calibrate on
    from mtrain.cli.evaluate import evaluate_run

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="eval", overrides=[f"run={run_dir}", "split=test", "device=cpu"])
    with pytest.raises(MtrainError, match="trained without a test split"):
        evaluate_run(cfg, log=lambda *_: None)


def test_fit_shows_progress_at_once_and_says_where_the_run_is(tmp_path, multi30k_slice, caplog):
    import logging

    caplog.set_level(logging.INFO, logger="mtrain")
    run_dir = tmp_path / "run"
    run_fit(
        compose_fit(
            [
                f"data.local_dir={multi30k_slice}",
                f"data.cache_dir={tmp_path / 'cache'}",
                *TINY,
                "train.valid_bleu=false",
                "data.train_limit=300",
                "train.max_updates=3",
                "train.log_every=50",
                "data.splits.test=null",
            ]
        ),
        run_dir,
    )
    text = caplog.text
    assert "train | update 1/" in text  # the first update, long before log_every=50
    assert text.index(f"run directory: {run_dir.resolve()}") < text.index("train | update 1/")  # said at the start
    assert f"mtrain translate run={run_dir.resolve()}" in text and f"tensorboard --logdir {run_dir.resolve()}" in text
    # data.splits.test=null: the closing hint scores the validation split, not a test split
    assert f"mtrain eval run={run_dir.resolve()} split=valid" in text and "split=test" not in text
    assert "disk use of the run:" in text
