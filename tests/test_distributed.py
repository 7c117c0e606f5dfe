"""DDP through torchrun on CPU (gloo): same result as one process on the same global batches."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch

from mtrain.train.budget import EndCost
from mtrain.train.distributed import DistributedContext
from tests.ddp_probe import run_two_ranks, run_with_a_death
from tests.fit_runs import TINY, scalars
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


def test_one_process_under_torchrun_joins_a_group_of_one(monkeypatch):
    """torchrun --nproc_per_node=1 trains in DDP too (the GPU session's NCCL step); without
    torchrun's environment a process stays alone."""
    from mtrain.train.distributed import init_distributed, shutdown_distributed

    for name in ("TORCHELASTIC_RUN_ID", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert not init_distributed("cpu", 60.0).enabled
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")  # what torchrun sets, with the rest
    for name, value in {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MASTER_PORT", str(29500 + os.getpid() % 1000))
    context = init_distributed("cpu", 60.0)
    try:
        assert context.enabled and context.is_main and context.world_size == 1
        assert torch.distributed.get_backend() == "gloo" and context.sum_each([2.0, 3.0]) == [2.0, 3.0]
    finally:
        shutdown_distributed(context)


@pytest.mark.slow
def test_an_ordinary_ddp_update_exchanges_nothing_beyond_the_gradient_reduction(tmp_path, multi30k_slice):
    """Per update, the loop's only collective is DDP's gradient all-reduce (one per bucket: the
    tiny model's gradients fill one); the ranks agree on stopping in one more collective, and
    only when an agreement is due (here after the first update, then every 30 s: never again).
    Before issue 61 an update also summed the token counts and agreed on the stop signal and
    the time budget: 3 collectives each."""
    overrides = [
        f"data.local_dir={multi30k_slice}",
        f"data.cache_dir={tmp_path / 'cache'}",
        *COMMON,
        "train.max_updates=12",
        "train.validate_every=1000",  # a validation exchanges more (rank 0's results): none mid-run
        "train.save_every=null",
    ]
    records = run_two_ranks(overrides, tmp_path / "run", agree_every_s=30.0)
    for record in records:
        rows = record["iterations"]
        assert [row["update"] for row in rows] == list(range(1, 12))
        # DDP rebuilds its buckets in the second update (broadcasts): from the third on it is settled
        settled = [row for row in rows if row["update"] >= 3]
        assert {row["in_update"] for row in settled} == {1}
        assert all(row["collectives"] == 1 + row["in_agreement"] for row in settled)
        assert all(row["in_agreement"] == int(row["agreed"]) for row in rows)
        assert [row["update"] for row in rows if row["agreed"]] == [1]


@pytest.mark.slow
def test_a_rank_that_dies_ends_the_other_with_one_line_naming_it(tmp_path, multi30k_slice):
    """Rank 1 killed (SIGKILL) as update 4 begins: rank 0, in the update's gradient all-reduce,
    stops within seconds with one line naming rank 1 and the cause (a traceback before)."""
    overrides = [
        f"data.local_dir={multi30k_slice}",
        f"data.cache_dir={tmp_path / 'cache'}",
        *COMMON,
        "train.max_updates=40",
        "train.validate_every=1000",
        "train.ddp_timeout=2m",
    ]
    survivor = run_with_a_death(overrides, tmp_path / "run", dying_rank=1, at_update=4)
    assert survivor["error"] is not None and "\n" not in survivor["error"]
    # gloo words the broken connection by which side noticed first (closed, or reset under a read)
    assert re.match(
        r"rank 0: rank 1 is gone \(gloo: (Connection closed by peer|Read error .*Connection reset by peer)",
        survivor["error"],
    ), survivor["error"]
    assert "during training (update 3)" in survivor["error"] and "train.resume=true" in survivor["error"]
    assert survivor["seconds"] < 30


def test_a_collective_that_failed_as_a_peer_died_is_one_line_naming_it():
    context = DistributedContext(rank=1, world_size=2, backend="gloo", timeout_seconds=120.0)
    gloo = RuntimeError(
        "[../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:4242. "
        "This is typically caused by a remote worker crashing. Check the logs of the remote worker."
    )
    gone = context.peer_failure(gloo, "training (update 7)")
    assert gone is not None and str(gone) == (
        "rank 1: rank 0 is gone (gloo: Connection closed by peer [127.0.0.1]:4242) during training (update 7); "
        "the job stops (train.resume=true continues from the last checkpoint)"
    )
    assert context.peer_failure(ValueError("a bug of ours"), "training") is None
    assert DistributedContext().peer_failure(gloo, "training") is None  # one process has no peers


def test_the_ddp_line_states_the_timeout_against_rank_0s_solo_work():
    context = DistributedContext(world_size=2, backend="nccl", timeout_seconds=600.0)
    assert context.describe(None).endswith("not estimated (no train.max_time)")
    line = context.describe(EndCost(validation=700.0, save=5.0, test=300.0))
    assert "at most 10m00s (train.ddp_timeout)" in line and "raise train.ddp_timeout above 11m45s" in line


@pytest.mark.slow
def test_two_ranks_agree_on_stopping_and_validating_by_time(tmp_path, multi30k_slice):
    """Under a training-time budget and validation by time, which each rank reads on its own
    clock, the ranks agree (every second here) and take the same branches: both stop after the
    same update, near the plan, having validated by time on the way (a rank that disagreed
    would hang the other in its collective)."""
    overrides = [
        f"data.local_dir={multi30k_slice}",
        f"data.cache_dir={tmp_path / 'cache'}",
        *COMMON,
        "train.max_train_time=10s",
        "train.validate_every=100000",
        "train.validate_every_time=4s",
    ]
    records = run_two_ranks(overrides, tmp_path / "run", agree_every_s=1.0)
    zero, one = ([row["update"] for row in record["iterations"]] for record in records)
    assert zero == one and len(zero) >= 2
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["stop_reason"] == "max_train_time=10s reached"
    assert 8.0 <= metrics["train_time_s"] <= 12.0
    validated = sorted(scalars(tmp_path / "run", "valid/loss"))
    assert len(validated) >= 2 and validated[-1] == metrics["updates"]  # by time (~4 s, ~8 s), and the last update
