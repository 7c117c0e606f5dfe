"""Checkpoint files: atomic writes, safe loading, clear errors."""

import os

import pytest
import torch

from mtrain.checkpoint.files import load_checkpoint, save_checkpoint
from mtrain.errors import MtrainError
from mtrain.rundir import RunDir


def test_round_trip(tmp_path):
    state = {"model": {"w": torch.arange(6.0).reshape(2, 3)}, "update": 7, "config": {"a": 1}}
    save_checkpoint(tmp_path / "c.pt", state)
    loaded = load_checkpoint(tmp_path / "c.pt")
    assert torch.equal(loaded["model"]["w"], state["model"]["w"])
    assert loaded["update"] == 7
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_failed_write_leaves_previous_checkpoint_intact(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    save_checkpoint(path, {"model": {"w": torch.ones(3)}, "update": 1})

    def full_disk(obj, f, *args, **kwargs):
        f.write(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(MtrainError, match="previous checkpoint is intact"):
        save_checkpoint(path, {"model": {"w": torch.zeros(3)}, "update": 2})
    monkeypatch.undo()
    assert load_checkpoint(path)["update"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_truncated_checkpoint_is_a_clear_error(tmp_path):
    path = tmp_path / "c.pt"
    save_checkpoint(path, {"model": {"w": torch.randn(1000)}})
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(MtrainError, match="truncated or corrupted"):
        load_checkpoint(path)


def test_checkpoint_with_code_is_refused(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    path = tmp_path / "evil.pt"
    torch.save({"model": {}, "payload": Evil()}, path)
    with pytest.raises(MtrainError, match="not a loadable"):
        load_checkpoint(path)


def test_find_checkpoint(tmp_path):
    run = RunDir(tmp_path)
    with pytest.raises(MtrainError, match="no checkpoints"):
        run.find_checkpoint("best")
    (tmp_path / "checkpoints").mkdir()
    for n in (10, 2, 30):
        save_checkpoint(tmp_path / "checkpoints" / f"update_{n}.pt", {"model": {}})
    save_checkpoint(tmp_path / "checkpoints" / "last.pt", {"model": {}})
    assert run.find_checkpoint("best").name == "last.pt"  # no best yet: fall back to last
    assert [p.name for p in run.update_checkpoints()] == ["update_2.pt", "update_10.pt", "update_30.pt"]
    assert run.find_checkpoint("update_10.pt").name == "update_10.pt"
    assert run.find_checkpoint("update_10").name == "update_10.pt"  # a name, as train.resume_from takes it


def test_checkpointer_keeps_the_optimiser_state_only_in_last(tmp_path):
    """last.pt resumes (everything); update_N.pt and best.pt hold the rest without Adam's
    moments; best.pt is a hard link of its update_N.pt, and old update_N.pt are pruned to keep_last."""
    from mtrain.train.checkpointer import Checkpointer

    run = RunDir(tmp_path / "run")
    checkpointer = Checkpointer(run, keep_last=2, save_every_seconds=None)
    moments = {"state": {0: {"exp_avg": torch.ones(100_000), "exp_avg_sq": torch.ones(100_000)}}, "param_groups": []}
    for update in (1, 2, 3):
        state = {
            "model": {"w": torch.full((100_000,), float(update))},
            "optimizer": moments,
            "scaler": {},
            "update": update,
            "trainer": {"update": update},
        }
        checkpointer.save(state, update, best=update == 2)
    last, best = load_checkpoint(run.checkpoint("last")), load_checkpoint(run.checkpoint("best"))
    assert last["update"] == 3 and torch.equal(last["optimizer"]["state"][0]["exp_avg"], torch.ones(100_000))
    assert best["update"] == 2 and "optimizer" not in best and best["trainer"] == {"update": 2}
    assert [p.name for p in run.update_checkpoints()] == ["update_2.pt", "update_3.pt"]
    update_3 = load_checkpoint(run.update_checkpoint(3))
    assert "optimizer" not in update_3 and torch.equal(update_3["model"]["w"], last["model"]["w"])
    assert run.update_checkpoint(3).stat().st_size < 0.5 * run.checkpoint("last").stat().st_size
    # best.pt and update_2.pt are one file with two names: stored once, counted once.
    best_file, update_2 = run.checkpoint("best").stat(), run.update_checkpoint(2).stat()
    assert best_file.st_ino == update_2.st_ino and best_file.st_nlink == 2
    use = run.disk_use_mb()
    assert use["checkpoints"] == round(
        sum(p.stat().st_size for p in run.checkpoint_dir.iterdir() if p.name != "best.pt") / 1e6, 1
    )
    assert use["total"] >= use["checkpoints"] > 0


def test_a_linked_best_checkpoint_survives_rewrites_and_pruning(tmp_path, monkeypatch):
    """Writing one name anew (last.pt at every save; update_N.pt again after a resume from an
    earlier one) never changes the file best.pt names; pruning its update_N.pt leaves it whole;
    where hard links are refused, best.pt is a copy."""
    from mtrain.train.checkpointer import Checkpointer

    def state(update: int, value: float) -> dict:
        return {"model": {"w": torch.full((1000,), value)}, "optimizer": {}, "update": update}

    run = RunDir(tmp_path / "run")
    checkpointer = Checkpointer(run, keep_last=1, save_every_seconds=None)
    checkpointer.save(state(2, 2.0), 2, best=True)
    best = run.checkpoint("best")
    assert best.stat().st_ino == run.update_checkpoint(2).stat().st_ino
    checkpointer.save(state(2, -1.0), 2, best=False)  # update_2.pt and last.pt written again (a resume)
    assert torch.equal(load_checkpoint(best)["model"]["w"], torch.full((1000,), 2.0))
    assert load_checkpoint(run.update_checkpoint(2))["model"]["w"][0] == -1.0
    assert best.stat().st_ino != run.update_checkpoint(2).stat().st_ino and best.stat().st_nlink == 1
    checkpointer.save(state(4, 4.0), 4, best=True)
    checkpointer.save(state(6, 6.0), 6, best=False)  # keep_last=1: update_4.pt goes, best.pt stays
    assert [p.name for p in run.update_checkpoints()] == ["update_6.pt"]
    assert load_checkpoint(best)["update"] == 4 and best.stat().st_nlink == 1
    assert load_checkpoint(run.checkpoint("last"))["update"] == 6 and not list(run.checkpoint_dir.glob(".*.tmp"))

    def no_links(*_):
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)  # a file system without hard links
    checkpointer.save(state(8, 8.0), 8, best=True)
    assert load_checkpoint(best)["update"] == 8 and best.stat().st_ino != run.update_checkpoint(8).stat().st_ino
