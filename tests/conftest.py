"""Shared fixtures: where the real corpora are, and small slices of them."""

from __future__ import annotations

import gzip
import importlib
import logging
import os
from pathlib import Path

import pytest
import sentencepiece as spm
import torch

from mtrain.tokenizer import Tokenizer
from tests.decoding_run import TINY_MODEL, untrained_model, write_run_dir, write_tiny_run

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


@pytest.fixture(scope="session")
def multi30k_spm_tokenizer(tmp_path_factory, data_dir) -> Tokenizer:
    """A real joint SentencePiece model trained on 400 Multi30k pairs (a second or so),
    shared by the decoding tests (test_translate, test_serve, test_alignment) of a worker."""
    return train_spm_tokenizer(tmp_path_factory.mktemp("spm") / "spm", data_dir, first_line=0)


@pytest.fixture(scope="module")
def tokenizer(multi30k_spm_tokenizer) -> Tokenizer:
    """The decoding tests' tokenizer: the worker's Multi30k SentencePiece model. A test module
    that needs another (its own pieces, language tags) defines its own `tokenizer`."""
    return multi30k_spm_tokenizer


@pytest.fixture(scope="module")
def model_shape() -> dict:
    """The `model` fixture's ModelConfig fields; a test module overrides it for another size."""
    return TINY_MODEL


@pytest.fixture(scope="module")
def model(tokenizer, model_shape):
    """A tiny untrained model (seed 0, eval mode) over the module's `tokenizer`."""
    return untrained_model(tokenizer, model_shape)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tokenizer, model, model_shape) -> Path:
    """A run directory as `mtrain fit` leaves it (de -> en): tokenizer/ and checkpoints/best.pt."""
    return write_run_dir(tmp_path_factory.mktemp("run"), tokenizer, model, model_shape)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """A run with three checkpoints of a tiny untrained model and its corpus, for `mtrain eval run=`
    and its reports (tests/decoding_run.py's write_tiny_run)."""
    return write_tiny_run(tmp_path_factory.mktemp("tiny_run"))


@pytest.fixture(scope="module")
def parent(tmp_path_factory, multi30k_slice) -> Path:
    """A parent run to fine-tune (tests/fit_runs.py's fit_parent): 2 updates on 300 Multi30k pairs."""
    from tests.fit_runs import fit_parent  # here: fit_runs imports this module

    return fit_parent(tmp_path_factory.mktemp("parent"), multi30k_slice)


@pytest.fixture
def one_thread():
    """One torch thread for a test module of tiny models, where threads cost more than they save
    (`pytestmark = pytest.mark.usefixtures("one_thread")`; after `_few_threads` below)."""
    torch.set_num_threads(1)


def train_spm_tokenizer(directory: Path, data_dir: Path, first_line: int) -> Tokenizer:
    """A joint SentencePiece model (300 pieces) of the 400 Multi30k training pairs from
    `first_line` on, written under `directory` (made here)."""
    lines = []
    for lang in ("de", "en"):
        with gzip.open(data_dir / "multi30k" / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
            lines += [line for i, line in zip(range(first_line + 400), f, strict=False) if i >= first_line]
    directory.mkdir(parents=True)
    (directory / "train.txt").write_text("".join(lines), encoding="utf-8")
    with open(os.devnull, "w") as quiet:
        spm.SentencePieceTrainer.train(
            input=str(directory / "train.txt"),
            model_prefix=str(directory / "spm"),
            vocab_size=300,
            unk_id=0,
            pad_id=1,
            bos_id=2,
            eos_id=3,
            logstream=quiet,
        )
    return Tokenizer({"spm.model": directory / "spm.model"})


@pytest.fixture(scope="session")
def fairseq_spm(tmp_path_factory, data_dir) -> Path:
    """A fairseq-numbered SentencePiece BPE model of Multi30k de+en (tests/m2m100_dirs.py)."""
    from tests.m2m100_dirs import train_fairseq_spm

    return train_fairseq_spm(tmp_path_factory.mktemp("fairseq_spm"), data_dir)


@pytest.fixture(scope="session")
def m2m100_dir(tmp_path_factory, fairseq_spm) -> Path:
    """A small random-weight M2M100 directory (M2M100Tokenizer's files), built once a session."""
    pytest.importorskip("transformers", reason="building M2M100 test models needs transformers")
    from tests.m2m100_dirs import build_m2m100_dir

    return build_m2m100_dir(tmp_path_factory.mktemp("m2m100") / "hf", fairseq_spm)


@pytest.fixture(scope="session")
def nllb_dir(tmp_path_factory, fairseq_spm) -> Path:
    """A small random-weight NLLB-200-shaped directory (NllbTokenizer's files, `[lang] x </s>`)."""
    pytest.importorskip("transformers", reason="building NLLB test models needs transformers")
    from tests.m2m100_dirs import build_nllb_dir

    return build_nllb_dir(tmp_path_factory.mktemp("nllb") / "hf", fairseq_spm)


@pytest.fixture(scope="session")
def nllb_legacy_dir(tmp_path_factory, fairseq_spm) -> Path:
    """`nllb_dir`'s model with `legacy_behaviour: true` (sources `x </s> [lang]`)."""
    pytest.importorskip("transformers", reason="building NLLB test models needs transformers")
    from tests.m2m100_dirs import build_nllb_dir

    return build_nllb_dir(tmp_path_factory.mktemp("nllb_legacy") / "hf", fairseq_spm, legacy=True)


def test_threads() -> int:
    """Threads one test may use: the cores shared among pytest-xdist's parallel workers, at most 2.

    Two workers on 2 cores each wanting 2 OpenMP threads spin against each other (a run with
    2 threads beside other work slowed 5-10x); one thread each keeps both cores busy without it.
    """
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, min(2, (os.cpu_count() or 1) // workers))


test_threads.__test__ = False  # a helper, not a test, though tests import it by this name


# The test files that take longest, slowest first (seconds per file of one `--durations=0` run,
# by scripts/slowest_test_files.py; test_types.py is placed by its cold run, as in CI, which has
# no mypy cache). pytest-xdist gives each worker whole files in collection order (addopts:
# --dist loadfile --no-loadscope-reorder; its default reorder puts the files with the most
# tests first, which left the 2-test files of half a minute each for the end and one worker idle).
# Long files start first; the short ones fill the workers' last minutes. Files not listed
# follow in their usual order.
SLOWEST_FILES = (
    "test_fit.py",
    "test_faults.py",
    "test_run_safety.py",
    "test_machine_share.py",  # (a fit of train.max_time=60s beside a busy process)
    "test_gpu_check.py",
    "test_translate.py",
    "test_distributed.py",
    "test_types.py",
    "test_model.py",
    "test_config_checks.py",
    "test_hf_export.py",
    "test_serve.py",
    "test_export.py",
    "test_evaluate_report.py",
    "test_compilation.py",
    "test_tokenizer.py",
    "test_host_memory.py",
    "test_bench_compile.py",
    "test_finetune.py",
    "test_ema.py",
    "test_batches_prepare.py",
    "test_ensemble.py",
    "test_properties.py",
    "test_experiments.py",
    "test_instruments.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: place for place, name in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's tests keep their order


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: one worker more than there are cores. With commands forked warm
    (tests/warm_process.py) much of the suite waits rather than computes (a budget on the clock,
    sleeps between kills, servers and their clients, mypy's files): two workers kept 2 cores
    only 144% busy; a third fills those waits."""
    return (os.cpu_count() or 1) + 1


_seconds_per_worker: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """On xdist's controller: each phase's time, added to the worker that ran it."""
    worker = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", None)
    if worker is not None:
        _seconds_per_worker[worker] = _seconds_per_worker.get(worker, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Beside the slowest tests in every log: how busy each worker was (an idle one at the end
    means the slowest files should start earlier: SLOWEST_FILES)."""
    if _seconds_per_worker:
        times = ", ".join(f"{worker} {seconds:.0f} s" for worker, seconds in sorted(_seconds_per_worker.items()))
        terminalreporter.write_line(f"time in tests per worker: {times}")


def pytest_configure(config: pytest.Config) -> None:
    # Subprocesses (`mtrain ...`, torchrun) inherit this unless a test sets its own.
    os.environ.setdefault("OMP_NUM_THREADS", str(test_threads()))


@pytest.fixture(autouse=True)
def _few_threads():
    torch.set_num_threads(test_threads())


def _drop_handlers_on_closed_streams() -> None:
    for logger in (logging.getLogger(), logging.getLogger("mtrain")):
        for handler in list(logger.handlers):
            if getattr(getattr(handler, "stream", None), "closed", False):
                logger.removeHandler(handler)


@pytest.fixture(autouse=True)
def _no_logging_into_a_closed_capture():
    """A command run in-process (Hydra configures logging) leaves handlers writing to the
    stdout/stderr a capturing test had then; once that capture is closed, any later log line
    in this worker prints a 'Logging error' traceback into the next test's stderr."""
    _drop_handlers_on_closed_streams()
    yield
    _drop_handlers_on_closed_streams()


def needed_in_ci(module: str, install: str):
    """`module` imported; outside CI a test without it is skipped saying `install`, in CI
    (CI=true, where .ci/run installs it) it fails: a missing install must not pass as a skip."""
    if os.environ.get("CI", "").lower() == "true":
        return importlib.import_module(module)
    return pytest.importorskip(module, reason=f"{module} is not installed: {install}")
