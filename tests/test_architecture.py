"""The layout is the dependency graph: every import-linter contract in pyproject.toml holds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[1]


def contracts() -> list[dict]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def layered_modules() -> set:
    """The top-level modules named by the pipeline's layers contract (the one over `mtrain.*`)."""
    (pipeline,) = [c for c in contracts() if c["type"] == "layers" and "containers" not in c]
    return {name.strip() for layer in pipeline["layers"] for name in layer.split("|")}


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
    # Every contract was checked and kept: one dropped from the run (or misspelt) would not count.
    assert f"Contracts: {len(contracts())} kept, 0 broken." in result.stdout
