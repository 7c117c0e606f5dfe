"""The code stays clean: ruff's lint rules and its formatter (configured in pyproject.toml) hold.

Like `lint-imports` in test_architecture.py, these checks are part of the test command, so a
new finding fails CI rather than waiting for a reviewer.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--no-cache", "."], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def test_ruff_finds_nothing():
    result = ruff("check")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_code_is_formatted():
    result = ruff("format", "--check")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
