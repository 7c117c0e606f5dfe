"""Checkpoint files: atomic writes, safe loading, clear errors."""

import os

import pytest
import torch

from mtrain.errors import MtrainError
from mtrain.rundir import RunDir
from mtrain.train.checkpoint_files import load_checkpoint, save_checkpoint


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
