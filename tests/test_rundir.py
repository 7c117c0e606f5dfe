"""mtrain.rundir: the atomic writer's files get the mode a plain write would give them."""

from __future__ import annotations

import os
import stat

import pytest
import torch

from mtrain.rundir import atomic_write_text
from mtrain.train.checkpoint_files import save_checkpoint


@pytest.fixture
def umask():
    """Set the process umask for one test, restoring the old one afterwards."""
    previous = os.umask(0o022)
    os.umask(previous)
    yield os.umask
    os.umask(previous)


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_atomically_written_files_honour_the_umask(tmp_path, umask, mask, mode):
    umask(mask)
    atomic_write_text(tmp_path / "config.yaml", "seed: 1\n")
    save_checkpoint(tmp_path / "checkpoints" / "last.pt", {"model": {"w": torch.zeros(2)}})
    (tmp_path / "plain.txt").write_text("written plainly\n")  # what the atomic writer must match
    for path in (tmp_path / "config.yaml", tmp_path / "checkpoints" / "last.pt", tmp_path / "plain.txt"):
        assert stat.S_IMODE(path.stat().st_mode) == mode, path.name


def test_replacing_a_file_keeps_its_mode_as_writing_to_it_would(tmp_path, umask):
    umask(0o022)
    target = tmp_path / "metrics.json"
    atomic_write_text(target, "{}")
    os.chmod(target, 0o640)  # chosen by its owner: a rewrite must not widen or narrow it
    atomic_write_text(target, '{"finished": true}')
    assert stat.S_IMODE(target.stat().st_mode) == 0o640 and target.read_text() == '{"finished": true}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]  # no temporary file left
