"""Fault injection on CPU: kills, stop signals, non-finite losses, out-of-memory, failed writes."""

from __future__ import annotations

import math
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from mtrain.checkpoint.files import load_checkpoint
from mtrain.cli.fit import run_fit
from mtrain.errors import MtrainError
from mtrain.rundir import RunDir
from mtrain.train.step import UpdateStep
from tests.fit_runs import TINY, compose_fit, scalars, start_fit, wait_for
from tests.warm_process import WarmPopen

# No test decode unless a test asks for one (data.splits.test=... later on its command line wins):
# these runs check what training does, and decoding an untrained model runs to its length limit.
FAST = [
    *TINY,
    "train.valid_bleu=false",
    "data.train_limit=600",
    "train.log_every=1",
    "train.loss_every=1",
    "data.splits.test=null",
]


def test_sigterm_writes_a_checkpoint_at_an_update_boundary(tmp_path, multi30k_slice):
    run_dir = tmp_path / "run"
    process = start_fit(
        [
            f"data.local_dir={multi30k_slice}",
            f"data.cache_dir={tmp_path / 'cache'}",
            *FAST,
            "train.max_updates=100000",
            "train.validate_every=100000",
            f"hydra.run.dir={run_dir}",
        ]
    )
    wait_for(run_dir / "tb", process)
    deadline = time.time() + 120
    while "train | update 2/" not in (run_dir / "train.log").read_text():  # some updates, no checkpoint yet
        assert process.poll() is None and time.time() < deadline
        time.sleep(0.1)
    process.send_signal(signal.SIGTERM)
    signalled = time.perf_counter()
    _, stderr = process.communicate(timeout=120)
    # A distinct status (128 + SIGTERM, as a shell reports it) so a scheduler can requeue the job.
    assert process.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert time.perf_counter() - signalled < 30  # no validation, no test decode: seconds, not minutes
    assert [line for line in stderr.splitlines() if line.startswith("mtrain: error:")] == [
        line for line in stderr.splitlines() if "stopped by SIGTERM" in line
    ]
    assert "Traceback" not in stderr
    state = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert state["update"] > 0
    assert state["trainer"]["update"] == state["update"]
    log = (run_dir / "train.log").read_text()
    assert "stop signal" in log and "valid |" not in log and not (run_dir / "metrics.json").exists()


def wait_for_line(path: Path, text: str, process: WarmPopen | subprocess.Popen, timeout: float = 120.0) -> None:
    wait_for(path, process, timeout)
    deadline = time.time() + timeout
    while text not in path.read_text():
        assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.time() < deadline, f"{text!r} never appeared in {path}"
        time.sleep(0.02)


def stop_error(stderr: str) -> str:
    """The one `mtrain: error:` line of a stopped run; no traceback."""
    errors = [line for line in stderr.splitlines() if line.startswith("mtrain: error:")]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return errors[0]


# The 2,000 training pairs of the slice as the evaluation split: a decode of many seconds.
LONG_DECODE = ["decode.beam=4", "decode.max_len_a=2", "decode.max_len_b=20"]


def test_sigint_during_the_test_decode_stops_it(tmp_path, multi30k_slice):
    run_dir = tmp_path / "run"
    process = start_fit(
        [
            f"data.local_dir={multi30k_slice}",
            f"data.cache_dir={tmp_path / 'cache'}",
            *FAST,
            *LONG_DECODE,
            "data.splits.test=train",
            "train.max_updates=2",
            "train.validate_every=2",
            f"hydra.run.dir={run_dir}",
        ]
    )
    wait_for_line(run_dir / "train.log", "training stopped: max_updates", process)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGINT, stderr[-3000:]
    assert "stopped by SIGINT during the test decode" in stop_error(stderr)
    assert load_checkpoint(run_dir / "checkpoints" / "best.pt")["update"] == 2  # what was saved stays
    assert not (run_dir / "metrics.json").exists() and not (run_dir / "eval" / "test.json").exists()


def test_sigterm_during_a_validation_stops_it_and_saves_the_update(tmp_path, multi30k_slice):
    run_dir = tmp_path / "run"
    process = start_fit(
        [
            f"data.local_dir={multi30k_slice}",
            f"data.cache_dir={tmp_path / 'cache'}",
            *FAST,
            *LONG_DECODE,
            "train.valid_bleu=true",
            "data.splits.valid=train",
            "decode.valid_beam=4",
            "train.max_updates=100",
            "train.validate_every=2",
            f"hydra.run.dir={run_dir}",
        ]
    )
    wait_for_line(run_dir / "train.log", "train | update 2/", process)  # the validation of update 2 begins
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert "stopped by SIGTERM at update 2" in stop_error(stderr)
    assert load_checkpoint(run_dir / "checkpoints" / "last.pt")["update"] == 2  # not one update more
    assert "valid |" not in (run_dir / "train.log").read_text()  # the validation did not run to its end


def test_sigterm_during_data_preparation_stops_it(tmp_path, multi30k_slice):
    run_dir = tmp_path / "run"
    process = start_fit(
        [
            f"data.local_dir={multi30k_slice}",
            f"data.cache_dir={tmp_path / 'cache'}",
            *FAST,
            "data.train_limit=null",
            "tokenizer.vocab_size=2000",
            f"hydra.run.dir={run_dir}",
        ],
        new_interpreter=True,  # its console is read as it runs
    )
    for line in process.stdout:  # the console: train.log is not written before the data is ready
        if "data: " in line:  # the tokenizer is trained, then the corpus encoded, from here on
            break
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert "stopped by SIGTERM during the data preparation" in stop_error(stderr)
    assert not run_dir.exists()  # no checkpoint of update 0, no log, no lock: the directory Hydra made is gone
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_dir() and ".tmp-" in p.name]


KILL_RUN = ["train.validate_every=2", "train.keep_last=2", "train.max_updates=24"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, multi30k_slice):
    """One uninterrupted run that every kill-and-resume run must reproduce exactly."""
    base = tmp_path_factory.mktemp("uninterrupted")
    common = [f"data.local_dir={multi30k_slice}", f"data.cache_dir={base / 'cache'}", *FAST, *KILL_RUN]
    run_fit(compose_fit(common), base / "run")
    return common, torch.load(base / "run" / "checkpoints" / "last.pt", weights_only=True)["model"]


@pytest.mark.slow
def test_ten_sigkills_at_random_moments_then_resume_match_an_uninterrupted_run(tmp_path, uninterrupted):
    """Kills land anywhere: at start-up, mid-update, inside checkpoint writes (every 2 updates
    here). After each one the newest checkpoint loads, and the run resumed to the end is
    bit-identical to the uninterrupted one (an update-based schedule)."""
    common, expected = uninterrupted
    # How long a whole run takes on this machine (start-up included): the kills are drawn within
    # it (a fixed 0.5-4 s window let a fast idle machine finish all 24 updates after 2 kills).
    started = time.monotonic()
    whole = start_fit([*common, f"hydra.run.dir={tmp_path / 'timed'}"], new_interpreter=True)
    _, stderr = whole.communicate(timeout=300)
    assert whole.returncode == 0, stderr[-3000:]
    duration = time.monotonic() - started
    killed = tmp_path / "killed"
    run = RunDir(killed)
    rng = random.Random(0)
    kills = 0
    while kills < 10:
        resume = ["train.resume=true"] if run.has_checkpoints() else []
        # A new interpreter each time: kills also land in its start-up (a warm fork trains at once
        # and ran the 24 updates to the end before the second kill).
        process = start_fit([*common, *resume, f"hydra.run.dir={killed}"], new_interpreter=True)
        # within what is left of the run (its start-up always): a resumed run has fewer updates to
        # go, and a fixed share of the whole let it finish after 4 kills when the load dropped
        done = load_checkpoint(run.checkpoint("last"))["update"] / 24 if run.checkpoint("last").exists() else 0.0
        time.sleep(rng.uniform(0.1, 0.8) * duration * max(1.0 - done, 0.3))
        if process.poll() is not None:  # it finished (or refused) before the kill
            _, stderr = process.communicate()
            assert process.returncode == 0, stderr[-3000:]
            break
        process.send_signal(signal.SIGKILL)
        process.communicate(timeout=60)
        kills += 1
        if run.checkpoint("last").exists():
            assert load_checkpoint(run.checkpoint("last"))["update"] >= 2  # intact and loadable
    assert kills >= 5

    run_fit(compose_fit([*common, "train.resume=true"]), killed)
    resumed = torch.load(run.checkpoint("last"), weights_only=True)
    assert resumed["update"] == 24  # never an extra update, even if a kill came after the end
    assert all(torch.equal(expected[name], resumed["model"][name]) for name in expected)


def _inject(monkeypatch, make_failure):
    """Replace UpdateStep.forward_loss so that the attempts (1, 2, ...) chosen by `make_failure` fail.

    A skipped (non-finite) update still counts as an update: attempt N is update N.
    """
    original = UpdateStep.forward_loss
    attempts = {"n": 0}

    def forward_loss(self, batch):
        attempts["n"] += 1
        failure = make_failure(attempts["n"])
        if failure == "nan":
            loss, nll = original(self, batch)
            return loss * float("nan"), nll
        if failure == "oom":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
        return original(self, batch)

    monkeypatch.setattr(UpdateStep, "forward_loss", forward_loss)


def test_nan_loss_is_skipped_and_counted(tmp_path, multi30k_slice, monkeypatch, caplog):
    _inject(monkeypatch, lambda attempt: "nan" if attempt in (3, 4) else None)
    cfg = compose_fit(
        [
            f"data.local_dir={multi30k_slice}",
            f"data.cache_dir={tmp_path / 'cache'}",
            *FAST,
            "train.max_updates=8",
            "train.validate_every=100",
        ]
    )
    metrics = run_fit(cfg, tmp_path / "run")
    assert metrics["skipped_updates"] == 2
    assert metrics["updates"] == 8
    assert "non-finite loss or gradient: 1 update(s) up to update 3 skipped" in caplog.text
    assert "non-finite loss or gradient: 1 update(s) up to update 4 skipped" in caplog.text
    losses = scalars(tmp_path / "run", "train/loss")
    assert all(math.isfinite(v) for v in losses.values())  # the skipped updates left no NaN in the log


def test_consecutive_nan_losses_abort_keeping_the_last_good_checkpoint(tmp_path, multi30k_slice, monkeypatch):
    _inject(monkeypatch, lambda attempt: "nan" if attempt >= 5 else None)
    cfg = compose_fit(
        [
            f"data.local_dir={multi30k_slice}",
            f"data.cache_dir={tmp_path / 'cache'}",
            *FAST,
            "train.max_updates=50",
            "train.validate_every=2",
            "train.max_bad_updates=3",
        ]
    )
    with pytest.raises(MtrainError, match="3 consecutive updates had a non-finite loss"):
        run_fit(cfg, tmp_path / "run")
    # Updates 5 and 6 were skipped on the device: the checkpoint of update 6 holds update 4's
    # weights, untouched; the divergence was caught at update 7 before anything else was saved.
    checkpoints = tmp_path / "run" / "checkpoints"
    state = load_checkpoint(checkpoints / "last.pt")
    assert state["update"] == 6 and state["trainer"]["skipped_updates"] == 2
    good = load_checkpoint(checkpoints / "update_4.pt")
    assert all(torch.equal(good["model"][name], tensor) for name, tensor in state["model"].items())
    assert all(torch.isfinite(t).all() for t in state["model"].values())


def test_out_of_memory_batch_is_skipped(tmp_path, multi30k_slice, monkeypatch, caplog):
    _inject(monkeypatch, lambda attempt: "oom" if attempt == 3 else None)
    cfg = compose_fit(
        [
            f"data.local_dir={multi30k_slice}",
            f"data.cache_dir={tmp_path / 'cache'}",
            *FAST,
            "train.max_updates=6",
            "train.validate_every=100",
        ]
    )
    metrics = run_fit(cfg, tmp_path / "run")
    assert metrics["updates"] == 6
    assert "out of memory on a batch of shape" in caplog.text


def test_repeated_out_of_memory_aborts_suggesting_smaller_batches(tmp_path, multi30k_slice, monkeypatch):
    _inject(monkeypatch, lambda attempt: "oom")
    cfg = compose_fit(
        [
            f"data.local_dir={multi30k_slice}",
            f"data.cache_dir={tmp_path / 'cache'}",
            *FAST,
            "train.max_updates=6",
            "train.max_oom_batches=3",
        ]
    )
    with pytest.raises(MtrainError, match="lower train.max_tokens"):
        run_fit(cfg, tmp_path / "run")


def test_failed_checkpoint_write_keeps_the_previous_one(tmp_path, multi30k_slice, monkeypatch):
    cfg = compose_fit(
        [
            f"data.local_dir={multi30k_slice}",
            f"data.cache_dir={tmp_path / 'cache'}",
            *FAST,
            "train.max_updates=4",
            "train.validate_every=2",
        ]
    )
    calls = {"n": 0}
    real_save = torch.save

    def disk_full_on_second_checkpoint(obj, f, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            f.write(b"partial bytes")
            raise OSError(28, "No space left on device")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", disk_full_on_second_checkpoint)
    with pytest.raises(MtrainError, match="No space left"):
        run_fit(cfg, tmp_path / "run")
    assert load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["update"] == 2
