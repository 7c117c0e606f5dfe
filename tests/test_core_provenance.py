"""A run's record of what ran: git commit and dirty flag (unknown outside mtrain's own checkout),
versions, sessions appended. The record `mtrain fit` writes: tests/test_fit.py."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from mtrain import provenance

REPO = Path(__file__).resolve().parents[1]
GIT = ["git", "-c", "user.name=test", "-c", "user.email=test@example.com", "-c", "commit.gpgsign=false"]


def _repository(top: Path, package: Path) -> str:
    """A git repository at `top` with one commit holding `package/__init__.py`; its commit."""
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("VALUE = 1\n")
    subprocess.run([*GIT, "init", "-q", str(top)], check=True)
    subprocess.run([*GIT, "-C", str(top), "add", "-A"], check=True)
    subprocess.run([*GIT, "-C", str(top), "commit", "-qm", "first"], check=True)
    return subprocess.run(
        ["git", "-C", str(top), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_the_code_of_a_checkout_is_its_commit_and_a_changed_tracked_file_makes_it_dirty(tmp_path):
    commit = _repository(tmp_path / "checkout", tmp_path / "checkout" / "mtrain")
    package = tmp_path / "checkout" / "mtrain"
    assert provenance.code_version(package) == {"commit": commit, "dirty": False}
    (tmp_path / "checkout" / "runs").mkdir()
    (tmp_path / "checkout" / "runs" / "train.log").write_text("a run's output, untracked\n")
    assert provenance.code_version(package)["dirty"] is False  # what git does not track is no change of code
    (package / "__init__.py").write_text("VALUE = 2\n")
    assert provenance.code_version(package) == {"commit": commit, "dirty": True}


def test_this_checkouts_code_is_its_head():
    if not (REPO / ".git").exists():
        pytest.skip("mtrain runs from an installed copy here, not a git checkout")
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    code = provenance.code_version()
    assert code["commit"] == head.stdout.strip() and isinstance(code["dirty"], bool)


def test_a_wheel_install_outside_a_checkout_says_unknown(tmp_path):
    package = tmp_path / "venv" / "lib" / "site-packages" / "mtrain"
    shutil.copytree(REPO / "mtrain", package, ignore=shutil.ignore_patterns("__pycache__"))
    assert provenance.code_version(package) == {"commit": "unknown", "dirty": "unknown"}


def test_a_wheel_install_inside_another_projects_checkout_does_not_take_its_commit(tmp_path):
    """A virtual environment inside a user's repository: that repository's commit is not mtrain's."""
    project = tmp_path / "project"
    _repository(project, project / "src")
    package = project / ".venv" / "lib" / "site-packages" / "mtrain"
    shutil.copytree(REPO / "mtrain", package, ignore=shutil.ignore_patterns("__pycache__"))
    assert provenance.code_version(package) == {"commit": "unknown", "dirty": "unknown"}


def test_without_git_the_code_is_unknown_and_nothing_fails(tmp_path, monkeypatch):
    _repository(tmp_path / "checkout", tmp_path / "checkout" / "mtrain")
    monkeypatch.setenv("PATH", str(tmp_path / "no-programs-here"))
    assert provenance.code_version(tmp_path / "checkout" / "mtrain") == {"commit": "unknown", "dirty": "unknown"}


def test_versions_name_mtrain_python_and_torch():
    import platform

    import torch

    found = provenance.versions()
    assert found["torch"] == torch.__version__
    assert found["python"] == platform.python_version()
    assert found["mtrain"] and found["sacrebleu"] != "unknown"


def test_each_session_is_appended_and_an_unreadable_file_is_kept_aside(tmp_path):
    path = tmp_path / "provenance.json"
    data = {"fingerprints": {"corpus": "c" * 64, "tokenizer": "t" * 64}, "caches": {}}
    first = provenance.session_record(["train.max_updates=2"], data, argv=["mtrain", "fit", "train.max_updates=2"])
    provenance.append_session(path, first)
    resumed = provenance.session_record(["train.resume=true"], data, resumed_from="checkpoints/last.pt", update=2)
    provenance.append_session(path, resumed)
    sessions = json.loads(path.read_text())["sessions"]
    assert [s["update"] for s in sessions] == [0, 2]
    assert sessions[0]["command"] == {
        "argv": ["mtrain", "fit", "train.max_updates=2"],
        "overrides": ["train.max_updates=2"],
    }
    assert sessions[1]["resumed_from"] == "checkpoints/last.pt"
    assert provenance.describe(first).endswith(f"training data {'c' * 16}, tokenizer {'t' * 16}")

    path.write_text("{ half written")
    provenance.append_session(path, resumed)
    assert (tmp_path / "provenance.json.unreadable").read_text() == "{ half written"  # the user's bytes stay
    assert len(json.loads(path.read_text())["sessions"]) == 1
