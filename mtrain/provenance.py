"""What ran: a run's record of its code, versions, command line and data (provenance.json).

`mtrain fit` writes it into the run directory as training starts, one entry per session (a
resumed run appends its own: the code may have changed in between), so a run says what produced
it without a checkpoint being loaded: the git commit of mtrain's code and whether the checkout
had changes, the versions of mtrain, torch, Python and the libraries that shape the results, the
command line, and the fingerprints of the training data and tokenizer (those the checkpoints
record, and a resume checks) with the cache entries they were read from.

An mtrain installed from a wheel has no git checkout: its commit and dirty flag are "unknown",
as they are when git is missing or mtrain's directory lies inside another project's checkout
(a virtual environment within a repository).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from mtrain.rundir import atomic_write_text

log = logging.getLogger("mtrain")

UNKNOWN = "unknown"
GIT_TIMEOUT_S = 10.0
# Libraries whose versions change what a run computes or scores.
LIBRARIES = ("torch", "sentencepiece", "sacrebleu", "numpy", "hydra-core")


def code_version(package_dir: Path | None = None) -> dict[str, Any]:
    """{"commit": ..., "dirty": ...} of the git checkout that holds mtrain's code at
    `package_dir` (default: this package); both "unknown" outside one. Dirty: a tracked file
    differs from the commit (files git does not track, such as run directories, do not count)."""
    package_dir = Path(package_dir if package_dir is not None else Path(__file__).parent).resolve()
    top = _git(package_dir, "rev-parse", "--show-toplevel")
    # Only mtrain's own checkout counts: a wheel installed into a virtual environment that lies
    # inside another repository would otherwise report that repository's commit.
    if top is None or Path(top).resolve() != package_dir.parent:
        return {"commit": UNKNOWN, "dirty": UNKNOWN}
    commit = _git(package_dir, "rev-parse", "HEAD")
    status = _git(package_dir, "status", "--porcelain", "--untracked-files=no")
    return {
        "commit": commit or UNKNOWN,
        "dirty": (status != "") if status is not None else UNKNOWN,
    }


def _git(directory: Path, *args: str) -> str | None:
    """git's output in `directory`, stripped; None when git is missing, fails or hangs."""
    try:
        done = subprocess.run(
            ["git", "-C", str(directory), *args],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},  # `git status` must not write the index
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def versions() -> dict[str, str]:
    """mtrain's, Python's and LIBRARIES' versions ("unknown" for one not installed)."""
    from mtrain import installed_version

    found = {"mtrain": installed_version(), "python": platform.python_version()}
    for name in LIBRARIES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = UNKNOWN
    return found


def session_record(
    overrides: Sequence[str],
    data: dict[str, Any],
    resumed_from: str | None = None,
    update: int = 0,
    argv: Sequence[str] | None = None,
) -> dict[str, Any]:
    """One session's entry: when it started, from which update (`resumed_from`: the checkpoint),
    the code, the versions, the command line (`argv`, default this process's, and Hydra's
    `overrides`) and `data` (fingerprints and cache entries)."""
    return {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "update": update,
        "resumed_from": resumed_from,
        "code": code_version(),
        "versions": versions(),
        "command": {"argv": list(sys.argv if argv is None else argv), "overrides": list(overrides)},
        "host": platform.node(),
        "data": data,
    }


def append_session(path: Path, record: dict[str, Any]) -> None:
    """Add `record` to the sessions of the provenance file at `path` (written atomically). A file
    that cannot be read as one is kept beside it (`<name>.unreadable`), never overwritten."""
    sessions: list[Any] = []
    if path.is_file():
        try:
            sessions = list(json.loads(path.read_text(encoding="utf-8"))["sessions"])
        except (OSError, ValueError, KeyError, TypeError) as error:
            aside = path.with_name(path.name + ".unreadable")
            os.replace(path, aside)
            log.warning("%s: unreadable (%s); kept as %s, and a new one begun", path, error, aside.name)
    atomic_write_text(path, json.dumps({"sessions": [*sessions, record]}, indent=2, default=str) + "\n")


def describe(record: dict[str, Any]) -> str:
    """The log line of a session's record: 'provenance: code 1a2b3c4d5e6f (dirty), mtrain 0.1.0,
    torch 2.13.0, Python 3.12.3; training data 0f1e2d3c4b5a6978, tokenizer 8a7b6c5d4e3f2a1b'."""
    code, found = record["code"], record["versions"]
    commit = code["commit"][:12] if code["commit"] != UNKNOWN else "unknown (no git checkout)"
    dirty = " (dirty)" if code["dirty"] is True else ""
    fingerprints = record["data"]["fingerprints"]
    return (
        f"provenance: code {commit}{dirty}, mtrain {found['mtrain']}, torch {found['torch']}, "
        f"Python {found['python']}; training data {fingerprints['corpus'][:16]}, "
        f"tokenizer {fingerprints['tokenizer'][:16]}"
    )
