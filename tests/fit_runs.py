"""What the tests of `mtrain fit` share: the tiny model and budget, composing fit's config as the
command does, running `mtrain` as a command (to its end, or started to be signalled), the check
before a run and its one-line refusal, reading a run's TensorBoard scalars and files, and the
check that a resumed run continues exactly."""

from __future__ import annotations

import copy
import functools
import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, open_dict
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from mtrain.cli.common import CONFIG_DIR, check_before_run
from mtrain.cli.fit import run_fit
from tests.conftest import test_threads
from tests.warm_process import WarmPopen, run_mtrain, start_mtrain

# A model and budget small enough for seconds of CPU time per run.
# fp32 training, as `precision=auto` picks on AVX2-only CPUs: on CPUs with bf16 products (AMX,
# AVX512-BF16) autocast makes a 64-wide model's updates ~2.5x slower (oneDNN builds a primitive
# per new shape), and these tests check the pipeline, not the precision. The bf16 path has its
# own tests (test_loss, test_generator, test_torch_engine, test_host_memory, test_gpu_check).
TINY = [
    "model.encoder_layers=2",
    "model.decoder_layers=2",
    "model.d_model=64",
    "model.heads=2",
    "model.ffn_dim=128",
    "tokenizer.vocab_size=600",
    "train.max_tokens=1024",
    "train.lr=3e-3",
    "train.warmup_updates=20",
    f"train.num_threads={test_threads()}",
    "train.precision=fp32",
    "decode.beam=2",
    "decode.max_len_b=5",
    "decode.max_len_a=1.2",
]


# The model of the fine-tuning tests' parent run, and the settings of a few quick updates.
PARENT_MODEL = ["model.layers=1", "model.d_model=32", "model.heads=2", "model.ffn_dim=64", "tokenizer.vocab_size=400"]
QUICK = [
    "train.max_tokens=1024",
    "train.lr=3e-3",
    "train.warmup_updates=2",
    f"train.num_threads={test_threads()}",
    "train.valid_bleu=false",
    "train.log_every=1",
    "train.loss_every=1",
    "data.splits.test=null",
]

# The margin over train.max_time the budget test allows: the process's exit after its last log
# line (about a second), and the error of an estimate measured while other tests share the cores.
BUDGET_MARGIN_S = 8


def compose_fit(overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose(config_name="fit", overrides=overrides)


def mtrain(*args, cwd=None, env=None, timeout=300, new_interpreter=False):
    """`mtrain *args` as a command (tests.warm_process): (returncode, stdout, stderr) as text."""
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    return run_mtrain(*args, cwd=cwd, env=full_env, text=True, timeout=timeout, new_interpreter=new_interpreter)


def scalars(run_dir: Path, tag: str) -> dict:
    accumulator = EventAccumulator(str(run_dir / "tb"))
    accumulator.Reload()
    return {event.step: event.value for event in accumulator.Scalars(tag)}


def check_resume_is_exact(common: list, tmp_path: Path) -> tuple:
    """Train 12 updates straight, and 6 then resumed to 12: the losses of updates 7-12 must be
    equal (a loss point every update). Returns both run directories and the straight run's metrics."""
    common = [*common, "train.loss_every=1"]
    straight = tmp_path / "straight"
    summary = run_fit(compose_fit(common + ["train.max_updates=12"]), straight)
    interrupted = tmp_path / "interrupted"
    run_fit(compose_fit(common + ["train.max_updates=6"]), interrupted)
    run_fit(compose_fit(common + ["train.max_updates=12", "train.resume=true"]), interrupted)
    expected, resumed = scalars(straight, "train/loss"), scalars(interrupted, "train/loss")
    for update in range(7, 13):
        assert resumed[update] == expected[update], update
    return straight, interrupted, summary


def one_error_line(result) -> str:
    """The one `mtrain: error:` line of a refused command (and no traceback)."""
    errors = [line for line in result.stderr.splitlines() if line.startswith("mtrain: error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    return errors[0]


def start_fit(overrides, new_interpreter: bool = False) -> WarmPopen | subprocess.Popen:
    """`mtrain fit` started, to be signalled; forked from the warm process (tests.warm_process)
    unless the test needs a `new_interpreter`: one whose start-up it kills, or whose stdout it
    reads while it runs. Read the output of a forked one by communicate(), at its end."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if not new_interpreter:
        return start_mtrain("fit", *overrides, env=env, text=True)
    return subprocess.Popen(
        [sys.executable, "-m", "mtrain", "fit", *overrides],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(path: Path, process: WarmPopen | subprocess.Popen, timeout: float = 120.0) -> None:
    """Until `path` exists, while `process` runs (its stderr in the failure otherwise)."""
    deadline = time.time() + timeout
    while not path.exists():
        assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.time() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def run_check(app: str, argv: list[str], capsys) -> tuple[int, list[str]]:
    """(exit status, stderr lines) of the check before `mtrain <app> <argv>`; 0 when it passes."""
    try:
        check_before_run(app, argv)
        status = 0
    except SystemExit as stop:
        status = stop.code
    return status, capsys.readouterr().err.splitlines()


def assert_refused(status: int, lines: list[str], start: str, part: str = "") -> None:
    """A refusal before the run: exit status 2 and one `mtrain: error:` line starting with `start`."""
    assert status == 2, lines
    assert len(lines) == 1 and lines[0].startswith(f"mtrain: error: {start}") and part in lines[0], lines


def snapshot(run_dir: Path) -> dict:
    """{relative path: sha256} of every file under `run_dir`."""
    return {
        str(path.relative_to(run_dir)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(run_dir.rglob("*"))
        if path.is_file()
    }


@functools.cache
def _composed(preset: str) -> DictConfig:
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose(config_name="fit", overrides=[f"experiment={preset}"], return_hydra_config=True)


def composed(preset: str) -> tuple[DictConfig, dict]:
    """(the FitConfig of `mtrain fit experiment=<preset>`, its hydra.sweeper.params)."""
    cfg = copy.deepcopy(_composed(preset))
    params = dict(cfg.hydra.sweeper.params or {})
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg, params


def fit_parent(base: Path, multi30k_slice: Path) -> Path:
    """base/run: 2 updates on 300 Multi30k pairs, with an EMA and model.output_vocab=target."""
    overrides = [
        f"data.local_dir={multi30k_slice}",
        f"data.cache_dir={base / 'cache'}",
        *PARENT_MODEL,
        *QUICK,
        "data.train_limit=300",
        "train.max_updates=2",
        "train.validate_every=2",
        "train.ema_decay=0.9",
        "model.output_vocab=target",
    ]
    run_fit(compose_fit(overrides), base / "run")
    return base / "run"
