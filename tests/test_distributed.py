"""DDP through torchrun on CPU (gloo): same result as one process on the same global batches."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.fit_runs import TINY
from tests.warm_process import run_python

COMMON = [
    *TINY,
    "train.valid_bleu=false",
    "data.train_limit=800",
    "model.dropout=0.0",
    "train.device=cpu",
    "train.precision=fp32",
    "train.num_threads=1",
    "train.validate_every=4",
    "train.log_every=1",
    "data.splits.test=null",  # these tests compare weights: a test decode per run (5 runs) would only cost time
]


def run(args, env_extra=None):
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **(env_extra or {}))
    result = run_python(*args, text=True, timeout=300, env=env)
    assert result.returncode == 0, "\n".join(
        line for line in result.stderr.splitlines() if "rror" in line or "mtrain" in line
    )[-6000:]
    return result


def torchrun(nproc, overrides):
    return run(
        [
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={nproc}",
            "-m",
            "mtrain",
            "fit",
            *overrides,
        ]
    )


def single(overrides):
    return run(["-m", "mtrain", "fit", *overrides])


def params(run_dir: Path):
    return torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["model"]


EMA = "train.ema_decay=0.9"  # the weights' average: each rank folds in the same weights


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, multi30k_slice):
    """8 updates on two gloo ranks: compared with one process, and with a resumed run."""
    base = tmp_path_factory.mktemp("ddp")
    data = [f"data.local_dir={multi30k_slice}", f"data.cache_dir={base / 'cache'}"]
    result = torchrun(2, [*data, *COMMON, EMA, "train.max_updates=8", f"hydra.run.dir={base / 'two'}"])
    return data, base / "two", result


@pytest.mark.slow
def test_two_gloo_ranks_match_one_process_with_accumulation(tmp_path, two_ranks):
    data, two_dir, ddp = two_ranks
    single([*data, *COMMON, EMA, "train.max_updates=8", "train.update_freq=2", f"hydra.run.dir={tmp_path / 'one'}"])
    assert "2 rank(s)" in (two_dir / "train.log").read_text() or "2 rank(s)" in ddp.stderr
    one, two = params(tmp_path / "one"), params(two_dir)
    for name in one:
        # Only the order of floating-point sums differs (all-reduce vs accumulation).
        assert torch.allclose(one[name], two[name], rtol=1e-4, atol=1e-5), name
    one_ema, two_ema = (
        torch.load(run / "checkpoints" / "last.pt", weights_only=True)["ema"] for run in (tmp_path / "one", two_dir)
    )
    assert all(torch.allclose(one_ema[name], two_ema[name], rtol=1e-4, atol=1e-5) for name in one_ema)
    # Only rank 0 writes: one event file, one set of checkpoints.
    assert len(list((two_dir / "tb").glob("events.*"))) == 1
    assert sorted(p.name for p in (two_dir / "checkpoints").glob("*.pt")) == sorted(
        p.name for p in (tmp_path / "one" / "checkpoints").glob("*.pt")
    )


@pytest.mark.slow
def test_resume_under_two_ranks_matches_uninterrupted(tmp_path, two_ranks):
    """Stopped at update 4 and resumed to 8 on two ranks: the weights and their average
    equal the uninterrupted run's bit for bit."""
    data, straight, _ = two_ranks
    torchrun(2, [*data, *COMMON, EMA, "train.max_updates=4", f"hydra.run.dir={tmp_path / 'resumed'}"])
    torchrun(
        2, [*data, *COMMON, EMA, "train.max_updates=8", "train.resume=true", f"hydra.run.dir={tmp_path / 'resumed'}"]
    )
    a, b = (torch.load(run / "checkpoints" / "last.pt", weights_only=True) for run in (straight, tmp_path / "resumed"))
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert all(torch.equal(a["ema"][k], b["ema"][k]) for k in a["ema"])
