"""The layout is the dependency graph: import-linter's layers contract (pyproject.toml) holds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[1]


def layered_modules() -> set:
    contract = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]
    return {name.strip() for layer in contract["layers"] for name in layer.split("|")}


def test_every_package_and_core_module_has_a_layer():
    top_level = {
        f"mtrain.{path.name}"
        for path in (REPO / "mtrain").iterdir()
        if path.is_dir() and (path / "__init__.py").exists()
    }
    top_level |= {
        f"mtrain.{path.stem}" for path in (REPO / "mtrain").glob("*.py") if path.stem not in ("__init__", "__main__")
    }
    assert top_level == layered_modules()  # a new package or module must take its place in the graph


def test_imports_follow_the_pipeline():
    lint_imports = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run(
        [str(lint_imports), "--no-cache"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-4000:]
    assert "1 kept, 0 broken" in result.stdout
