"""mtrain.rundir: the atomic writer's files get the mode a plain write would give them; one writer per run."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys

import pytest
import torch

from mtrain.checkpoint.files import save_checkpoint
from mtrain.errors import MtrainError
from mtrain.rundir import RunDir, RunLock, atomic_write_text, staged


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


def test_a_run_has_one_lock_holder_and_the_refused_one_changes_nothing(tmp_path):
    run = RunDir(tmp_path)
    with RunLock(run):
        held = run.lock_file.read_bytes()
        with pytest.raises(MtrainError, match=rf"^{tmp_path} is in use by process {os.getpid()} on this machine"):
            RunLock(run).acquire()  # another open file of the same process: flock refuses it too
        assert run.lock_file.read_bytes() == held
    assert not run.lock_file.exists()  # let go: the file goes with the lock
    with RunLock(run):
        pass


def test_a_sigkilled_holder_leaves_a_file_but_no_lock(tmp_path):
    run = RunDir(tmp_path)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from mtrain.rundir import RunDir, RunLock; "
            f"RunLock(RunDir({str(tmp_path)!r})).acquire(); print('held', flush=True); "
            "time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(MtrainError, match=f"in use by process {holder.pid} on this machine"):
            RunLock(run).acquire()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.communicate(timeout=30)
    assert run.lock_file.exists()  # what a PID file would be: stale, yet no one holds it
    with RunLock(run):
        assert run.lock_file.read_text().split()[0] == str(os.getpid())


# ------------------------------------------------------------------ staged
def build(target, fail: bool = False, **options) -> None:
    """A directory build through `staged`, which fails half way with `fail`."""
    with staged(target, **options) as staging:
        (staging / "ours").write_text("ours", encoding="utf-8")
        if fail:
            raise RuntimeError("the build failed")


def test_staged_publishes_only_a_finished_build_and_replaces_files_and_directories(tmp_path):
    target = tmp_path / "out"
    with pytest.raises(RuntimeError):
        build(target, fail=True)
    assert list(tmp_path.iterdir()) == []  # neither a target nor a staging directory
    for directory, previous in ((True, None), (False, "directory"), (True, "file"), (False, "file")):
        with staged(target, directory=directory) as staging:
            assert staging.exists() == directory and target.exists() == bool(previous)
            if directory:
                (staging / "model.bin").write_text("new", encoding="utf-8")
            else:
                staging.write_text("package", encoding="utf-8")
        assert target.is_dir() == directory and [p.name for p in tmp_path.iterdir()] == ["out"]
    with pytest.raises(RuntimeError):
        build(target, fail=True)  # leaves the previous output
    assert target.read_text(encoding="utf-8") == "package" and [p.name for p in tmp_path.iterdir()] == ["out"]


def test_staged_keeps_an_entry_another_process_published_meanwhile(tmp_path):
    entry = tmp_path / "entry"

    def complete(path):
        return (path / "COMPLETE").is_file()

    with staged(entry, keep_existing=complete) as staging:
        (staging / "ours").write_text("ours", encoding="utf-8")
        entry.mkdir()  # another rank published the same entry while we built ours
        (entry / "COMPLETE").write_text("ok", encoding="utf-8")
    assert sorted(p.name for p in entry.iterdir()) == ["COMPLETE"] and [p.name for p in tmp_path.iterdir()] == ["entry"]
    (entry / "COMPLETE").rename(entry / "half")  # a copy stopped half way
    with pytest.raises(OSError):
        build(entry, keep_existing=complete)
    assert [p.name for p in tmp_path.iterdir()] == ["entry"]  # an incomplete one is not taken for ours
