"""Shared fixtures: where the real corpora are, and small slices of them."""

from __future__ import annotations

import gzip
import importlib
import os
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path:
    """`$MTRAIN_DATA_DIR`, else ../shared/data next to the repository (as in CI)."""
    return Path(os.environ.get("MTRAIN_DATA_DIR", REPO_ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def data_dir() -> Path:
    path = shared_data_dir()
    if not (path / "multi30k" / "train.de.gz").exists():
        pytest.skip(f"real corpora not found under {path} (set MTRAIN_DATA_DIR)")
    return path


def write_head(corpus_file: Path, out: Path, count: int) -> None:
    """The first `count` lines of a gzip-compressed corpus file written to `out` (a test slice)."""
    with gzip.open(corpus_file, "rt", encoding="utf-8") as lines:
        out.write_text("".join(next(lines) for _ in range(count)), encoding="utf-8")


@pytest.fixture(scope="session")
def multi30k_slice(tmp_path_factory, data_dir) -> Path:
    """A 2,000/100/100-pair slice of Multi30k de-en in the `{split}.{lang}` layout."""
    out = tmp_path_factory.mktemp("m30k_slice")
    sizes = {"train": 2000, "val": 100, "test_2016_flickr": 100}
    for split, n in sizes.items():
        for lang in ("de", "en"):
            write_head(data_dir / "multi30k" / f"{split}.{lang}.gz", out / f"{split}.{lang}", n)
    return out


@pytest.fixture(autouse=True)
def _few_threads():
    # Tests share 2 cores; more threads than that only adds contention.
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    return


def needed_in_ci(module: str, install: str):
    """`module` imported; outside CI a test without it is skipped saying `install`, in CI
    (CI=true, where .ci/run installs it) it fails: a missing install must not pass as a skip."""
    if os.environ.get("CI", "").lower() == "true":
        return importlib.import_module(module)
    return pytest.importorskip(module, reason=f"{module} is not installed: {install}")
