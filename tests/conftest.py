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


def test_threads() -> int:
    """Threads one test may use: the cores shared among pytest-xdist's parallel workers, at most 2.

    Two workers on 2 cores each wanting 2 OpenMP threads spin against each other (a run with
    2 threads beside other work slowed 5-10x); one thread each keeps both cores busy without it.
    """
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, min(2, (os.cpu_count() or 1) // workers))


test_threads.__test__ = False  # a helper, not a test, though tests import it by this name


def pytest_configure(config: pytest.Config) -> None:
    # Subprocesses (`mtrain ...`, torchrun) inherit this unless a test sets its own.
    os.environ.setdefault("OMP_NUM_THREADS", str(test_threads()))


@pytest.fixture(autouse=True)
def _few_threads():
    torch.set_num_threads(test_threads())


def needed_in_ci(module: str, install: str):
    """`module` imported; outside CI a test without it is skipped saying `install`, in CI
    (CI=true, where .ci/run installs it) it fails: a missing install must not pass as a skip."""
    if os.environ.get("CI", "").lower() == "true":
        return importlib.import_module(module)
    return pytest.importorskip(module, reason=f"{module} is not installed: {install}")
