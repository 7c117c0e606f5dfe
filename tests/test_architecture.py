"""The layout is the dependency graph: every import-linter contract in pyproject.toml holds,
between mtrain's packages and between mtrain.decode's subpackages."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[1]


def contracts() -> list[dict]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def layered_modules(contract: dict) -> set:
    return {name.strip() for layer in contract["layers"] for name in layer.split("|")}


def contract_of(container: str) -> dict:
    (contract,) = [contract for contract in contracts() if contract.get("containers") == [container]]
    return contract


def parts_of(package: Path, prefix: str = "") -> set:
    """The subpackages and modules directly inside `package` (its __init__ aside)."""
    parts = {f"{prefix}{path.name}" for path in package.iterdir() if (path / "__init__.py").exists()}
    return parts | {
        f"{prefix}{path.stem}" for path in package.glob("*.py") if path.stem not in ("__init__", "__main__")
    }


def test_every_package_and_core_module_has_a_layer():
    pipeline = contracts()[0]
    assert "containers" not in pipeline
    assert parts_of(REPO / "mtrain", "mtrain.") == layered_modules(pipeline)  # a new one must take its place


def test_every_part_of_decode_has_a_layer():
    # a module left loose in mtrain/decode/ (or its search/) would be outside the contract: nothing
    # would stop it importing any layer, nor any layer importing it
    assert parts_of(REPO / "mtrain" / "decode") == layered_modules(contract_of("mtrain.decode"))
    assert parts_of(REPO / "mtrain" / "decode" / "search") == layered_modules(contract_of("mtrain.decode.search"))


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
