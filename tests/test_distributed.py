"""DDP through torchrun on CPU (gloo): same result as one process on the same global batches."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.test_fit import TINY

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
    result = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, "\n".join(
        line for line in result.stderr.splitlines() if "rror" in line or "mtrain" in line
    )[-6000:]
    return result


def torchrun(nproc, overrides):
    return run(
        [
            sys.executable,
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
    return run([sys.executable, "-m", "mtrain", "fit", *overrides])


def params(run_dir: Path):
    return torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["model"]


@pytest.mark.slow
def test_two_gloo_ranks_match_one_process_with_accumulation(tmp_path, multi30k_slice):
    data = [f"data.local_dir={multi30k_slice}", f"data.cache_dir={tmp_path / 'cache'}"]
    ema = "train.ema_decay=0.9"  # the weights' average: each rank folds in the same weights
    single([*data, *COMMON, ema, "train.max_updates=8", "train.update_freq=2", f"hydra.run.dir={tmp_path / 'one'}"])
    ddp = torchrun(2, [*data, *COMMON, ema, "train.max_updates=8", f"hydra.run.dir={tmp_path / 'two'}"])
    assert "2 rank(s)" in (tmp_path / "two" / "train.log").read_text() or "2 rank(s)" in ddp.stderr
    one, two = params(tmp_path / "one"), params(tmp_path / "two")
    for name in one:
        # Only the order of floating-point sums differs (all-reduce vs accumulation).
        assert torch.allclose(one[name], two[name], rtol=1e-4, atol=1e-5), name
    one_ema, two_ema = (
        torch.load(tmp_path / name / "checkpoints" / "last.pt", weights_only=True)["ema"] for name in ("one", "two")
    )
    assert all(torch.allclose(one_ema[name], two_ema[name], rtol=1e-4, atol=1e-5) for name in one_ema)
    # Only rank 0 writes: one event file, one set of checkpoints.
    assert len(list((tmp_path / "two" / "tb").glob("events.*"))) == 1
    assert sorted(p.name for p in (tmp_path / "two" / "checkpoints").glob("*.pt")) == sorted(
        p.name for p in (tmp_path / "one" / "checkpoints").glob("*.pt")
    )


@pytest.mark.slow
def test_resume_under_two_ranks_matches_uninterrupted(tmp_path, multi30k_slice):
    data = [f"data.local_dir={multi30k_slice}", f"data.cache_dir={tmp_path / 'cache'}"]
    torchrun(2, [*data, *COMMON, "train.max_updates=8", f"hydra.run.dir={tmp_path / 'straight'}"])
    torchrun(2, [*data, *COMMON, "train.max_updates=4", f"hydra.run.dir={tmp_path / 'resumed'}"])
    torchrun(2, [*data, *COMMON, "train.max_updates=8", "train.resume=true", f"hydra.run.dir={tmp_path / 'resumed'}"])
    a, b = params(tmp_path / "straight"), params(tmp_path / "resumed")
    assert all(torch.equal(a[k], b[k]) for k in a)
