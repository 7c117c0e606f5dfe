"""The code type-checks: mypy, configured in pyproject.toml ([tool.mypy]: strict below cli/), finds nothing.

Like `lint-imports` in test_architecture.py and ruff in test_lint.py, this is part of the test
command, so a type error fails CI rather than waiting for a reviewer.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# mypy's incremental cache, outside the checkout (nothing to ignore or commit) and one per
# checkout: a warm run rechecks only the changed modules and what imports them (seconds; the
# cold run takes a minute). MYPY_CACHE_DIR overrides it (e.g. a directory CI keeps).
_CHECKOUT = hashlib.sha256(str(REPO).encode()).hexdigest()[:12]
CACHE_DIR = os.environ.get("MYPY_CACHE_DIR") or str(Path(tempfile.gettempdir()) / f"mtrain-mypy-{_CHECKOUT}")


def test_mypy_finds_nothing():
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", CACHE_DIR],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
