"""The run directory: every path and file name of a run, and the one atomic writer.

`mtrain fit` writes a run directory; translate, eval, report, average and export read it.
Every name below is spelled here and nowhere else:

    config.yaml              the resolved config the run was trained with
    parent.yaml              with init_from: the parent's path, checkpoint, sha256, weights, config
    .hydra/overrides.yaml    the command-line overrides (labels runs in sweep reports)
    tokenizer/               the SentencePiece model(s)
    data/{valid,test}.{src,ref}   the raw text the run validated and was tested on
                             (a multilingual run: data/{valid,test}.<src>-<tgt>.{src,ref} per direction)
    checkpoints/             update_N.pt, last.pt, best.pt, average_lastN.pt
    eval/                    reports of `mtrain eval` and fit's test decode (test.json; a
                             multilingual run's per direction: test.de-en.json)
    tb/                      TensorBoard events
    train.log, metrics.json
    confidence.json          the confidence score's calibration (mtrain.decode.translation.confidence), written by fit
    provenance.json          what ran, one entry per session: git commit and dirty flag, versions,
                             command line, data fingerprints and caches (mtrain.provenance)
    failed.json              why a job of a `-m` sweep failed (written by mtrain.cli.common)
    .lock                    held by the one process writing the run (`RunLock`)

An `mtrain export` directory is no run directory: every export directory holds its
`EXPORT_METADATA_FILE` (mtrain.export writes it; its "format" says which), and `is_export_dir`
knows a CTranslate2 one by it (mtrain.decode.engines.ct2_engine reads it), so a command given one as
run= (and the config checks) can tell it apart.

Writes that must never leave a half-written file go through `atomic_write`: the bytes go
to a temporary file in the same directory, are fsynced, and are renamed over the target.
`atomic_link` gives a file a second name the same way (best.pt and the update_N.pt it equals).
Whatever is built as a whole (an export's directory or package, a cache entry) is built by
`staged`: under a temporary name beside its place, renamed into place when complete.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import socket
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from mtrain.errors import MtrainError

_UPDATE_NAME = re.compile(r"^update_(\d+)\.pt$")
TMP_SUFFIX = ".tmp"

# What `mtrain export` writes beside the model: where it came from, special tokens, position limit.
EXPORT_METADATA_FILE = "mtrain_export.json"

# A run's confidence calibration (mtrain.decode.translation.confidence), beside its checkpoints.
CONFIDENCE_FILE = "confidence.json"


def export_format(path: str | Path) -> str | None:
    """The format of the `mtrain export` directory `path` (ctranslate2, hf), by the "format" of
    its EXPORT_METADATA_FILE; None when `path` holds none. A file without a readable format is a
    CTranslate2 export's (the first format, whose loader then says what is wrong with it)."""
    record_file = Path(path) / EXPORT_METADATA_FILE
    if not record_file.is_file():
        return None
    try:
        record = json.loads(record_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "ctranslate2"
    return str(record.get("format", "ctranslate2")) if isinstance(record, dict) else "ctranslate2"


def is_export_dir(path: str | Path) -> bool:
    """Whether `path` is a CTranslate2 model directory written by `mtrain export`."""
    return export_format(path) == "ctranslate2"


def atomic_write(path: str | Path, write: Callable[[IO[bytes]], object]) -> None:
    """Call `write(file)` on a temporary file beside `path`, fsync it, rename it over `path`.

    A crash at any moment leaves either the old file or the new one, never a mix; an error
    removes the temporary file and re-raises.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = _create_temporary_file(path)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
        _fsync_directory(path.parent)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise


def atomic_link(source: str | Path, target: str | Path) -> bool:
    """Make `target` a second name of `source`'s file (a hard link: the bytes are stored once),
    atomically: the link is made under a temporary name beside `target` and renamed over it, so
    `target` is at every moment the old file or the new one. True when linked; False when the file
    system refuses hard links, and `target` was written as a copy instead (`atomic_write`).

    Safe because every writer of a run's files renames a new file into place (`atomic_write`):
    rewriting one name gives it a new file and leaves the other name's bytes alone, and deleting
    one name leaves the other whole. Writing *into* one of the names (`cp new best.pt`,
    `torch.save(state, "best.pt")`) would change both: replace such a file with `mv`.
    """
    source, target = Path(source), Path(target)
    tmp_name = target.parent / f".{target.name}.{secrets.token_hex(4)}{TMP_SUFFIX}"
    try:
        os.link(source, tmp_name)
    except OSError:  # no hard links here (some network and FUSE file systems): a copy of its own
        with open(source, "rb") as handle:
            atomic_write(target, lambda out: _copy(handle, out))
        return False
    try:
        os.replace(tmp_name, target)
        _fsync_directory(target.parent)
    except BaseException:
        tmp_name.unlink(missing_ok=True)
        raise
    return True


def _copy(source: IO[bytes], target: IO[bytes]) -> None:
    while block := source.read(1 << 24):
        target.write(block)


def _create_temporary_file(path: Path) -> tuple[int, str]:
    """A new, uniquely named file beside `path`, open for writing, with the mode a plain write
    would leave: that of `path` when it exists, else 0666 less the umask (the kernel applies
    it). `tempfile.mkstemp` makes 0600 files, and the mode survives the rename: every run file
    would come out private under umask 022."""
    while True:
        tmp_name = str(path.parent / f".{path.name}.{secrets.token_hex(4)}{TMP_SUFFIX}")
        try:
            fd = os.open(tmp_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
        except FileExistsError:
            continue
        try:
            os.chmod(tmp_name, stat.S_IMODE(os.stat(path).st_mode))
        except FileNotFoundError:
            pass
        except BaseException:
            os.close(fd)
            os.unlink(tmp_name)
            raise
        return fd, tmp_name


def atomic_write_text(path: str | Path, text: str) -> None:
    """`atomic_write` of UTF-8 text."""
    data = text.encode("utf-8")
    atomic_write(path, lambda handle: handle.write(data))


@contextlib.contextmanager
def staged(
    target: str | Path,
    *,
    directory: bool = True,
    staging: Path | None = None,
    keep_existing: Callable[[Path], bool] | None = None,
) -> Iterator[Path]:
    """Build `target` (a directory; a file with `directory=False`) under a temporary name beside
    it, and rename it into place when the block ends without an error: a reader never sees a
    half-built one, and a failed or killed build leaves `target` as it was.

    Yields the staging path, `.<name>.partial-<pid>` beside `target` unless `staging` names
    another: an empty directory, or nothing yet for the block to write a file at. Whatever is
    there already (left by a killed process of the same pid) is removed first; on an error the
    staging path is removed and the error re-raised.

    What is at `target` when the block ends is replaced, file or directory: it is renamed aside,
    the new one renamed in, the old one removed (a file over a file is one atomic rename).
    Callers decide before the build whether it may be replaced (`mtrain export`'s check). With
    `keep_existing`, a `target` that appeared during the build (another process built the same
    thing: a cache entry) is kept instead when `keep_existing(target)` says it is whole, and
    the staging discarded.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(staging) if staging is not None else target.with_name(f".{target.name}.partial-{os.getpid()}")
    _remove_path(staging)
    try:
        # (made inside the try: a stop signal raised as mkdir returns must not leave it behind)
        if directory:
            staging.mkdir()
        yield staging
        _publish(staging, target, keep_existing)
    except BaseException:
        _remove_path(staging)
        raise


def _publish(staging: Path, target: Path, keep_existing: Callable[[Path], bool] | None) -> None:
    """Rename the finished `staging` to `target` (see `staged`)."""
    if keep_existing is not None:
        try:
            os.rename(staging, target)
        except OSError:
            if not keep_existing(target):
                raise
            _remove_path(staging)
        return
    replaced = os.path.lexists(target)
    if not replaced or (staging.is_file() and not (target.is_dir() and not target.is_symlink())):
        os.replace(staging, target)  # nothing there, or a file (a link) over a file: one atomic rename
    else:
        aside = target.with_name(f".{target.name}.replaced-{os.getpid()}")
        _remove_path(aside)
        os.rename(target, aside)
        try:
            os.rename(staging, target)
        except BaseException:
            os.rename(aside, target)
            raise
        _remove_path(aside)
    _fsync_directory(target.parent)


def _remove_path(path: Path) -> None:
    """Remove a file, a link or a directory tree at `path`, if there is one."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        path.unlink()


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class RunDir:
    """The paths of one run directory (nothing is created until something is written)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    # ------------------------------------------------------------------ files
    @property
    def config_file(self) -> Path:
        return self.path / "config.yaml"

    @property
    def parent_file(self) -> Path:
        """What a run started with init_from records of its parent (mtrain.train.init_from)."""
        return self.path / "parent.yaml"

    @property
    def hydra_dir(self) -> Path:
        return self.path / ".hydra"

    @property
    def overrides_file(self) -> Path:
        return self.hydra_dir / "overrides.yaml"

    @property
    def tokenizer_dir(self) -> Path:
        return self.path / "tokenizer"

    @property
    def metrics_file(self) -> Path:
        return self.path / "metrics.json"

    @property
    def confidence_file(self) -> Path:
        return self.path / CONFIDENCE_FILE

    @property
    def provenance_file(self) -> Path:
        """`provenance.json`: what each session of the run ran (mtrain.provenance)."""
        return self.path / "provenance.json"

    @property
    def failed_file(self) -> Path:
        """`failed.json`: the reason a sweep job failed, and its overrides (the job may have
        failed before `.hydra/overrides.yaml` was written)."""
        return self.path / "failed.json"

    @property
    def log_file(self) -> Path:
        return self.path / "train.log"

    @property
    def lock_file(self) -> Path:
        return self.path / ".lock"

    @property
    def tensorboard_dir(self) -> Path:
        return self.path / "tb"

    @property
    def eval_dir(self) -> Path:
        return self.path / "eval"

    def eval_file(self, split: str, kind: str) -> Path:
        """`eval/<split>.<kind>`: kind is hyp, json or md."""
        return self.eval_dir / f"{split}.{kind}"

    @property
    def data_dir(self) -> Path:
        return self.path / "data"

    def split_files(self, split: str, direction: str | None = None) -> tuple[Path, Path]:
        """The run's own copy of a split's raw sources and references (one sentence a line);
        a multilingual run keeps one per `direction` (`de-en`)."""
        name = split if direction is None else f"{split}.{direction}"
        return self.data_dir / f"{name}.src", self.data_dir / f"{name}.ref"

    # ------------------------------------------------------------------ checkpoints
    @property
    def checkpoint_dir(self) -> Path:
        return self.path / "checkpoints"

    def checkpoint(self, name: str) -> Path:
        """`checkpoints/<name>.pt` (name: last, best, update_N, average_lastN)."""
        return self.checkpoint_dir / f"{name}.pt"

    def update_checkpoint(self, update: int) -> Path:
        return self.checkpoint(f"update_{update}")

    def update_checkpoints(self) -> list[Path]:
        """The `update_<N>.pt` checkpoints, oldest first."""
        if not self.checkpoint_dir.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.checkpoint_dir.iterdir() if (m := _UPDATE_NAME.match(p.name))]
        return [p for _, p in sorted(found)]

    def has_checkpoints(self) -> bool:
        return self.checkpoint("last").is_file() or bool(self.update_checkpoints())

    def find_checkpoint(self, which: str = "best") -> Path:
        """Resolve `best`, `last`, a checkpoint name (`update_200`) or a path to an existing file.

        `best` falls back to `last` (a run stopped before its first validation).
        """
        if which not in ("best", "last"):
            path = Path(which)
            if not path.is_absolute() and not path.exists():
                name = which if which.endswith(".pt") else f"{which}.pt"
                path = self.checkpoint_dir / name
            if not path.is_file():
                raise MtrainError(f"checkpoint={which}: no such file (looked in . and {self.checkpoint_dir})")
            return path
        if not self.path.is_dir():
            raise MtrainError(f"run={self.path}: no such run directory")
        path = self.checkpoint(which)
        if path.is_file():
            return path
        if which == "best" and self.checkpoint("last").is_file():
            return self.checkpoint("last")
        raise MtrainError(
            f"run={self.path}: no checkpoints in {self.checkpoint_dir}; "
            "is this a run directory written by `mtrain fit`?"
        )

    def stale_temporary_files(self) -> list[Path]:
        """Temporary files of interrupted atomic writes (safe to delete: never renamed)."""
        found: list[Path] = []
        for directory in (self.path, self.checkpoint_dir, self.eval_dir, self.data_dir):
            if directory.is_dir():
                found += [p for p in directory.iterdir() if p.name.startswith(".") and p.name.endswith(TMP_SUFFIX)]
        return found

    def disk_use_mb(self) -> dict[str, float]:
        """How much the run's files take (MB of their sizes, a hard-linked file once): `total`, and
        `checkpoints` of it."""

        def megabytes(directory: Path) -> float:
            files = (
                [p for p in directory.rglob("*") if p.is_file() and not p.is_symlink()] if directory.is_dir() else []
            )
            # A file with two names (best.pt, a hard link of an update_N.pt) takes its space once.
            sizes = {(stat.st_dev, stat.st_ino): stat.st_size for stat in (p.stat() for p in files)}
            return round(sum(sizes.values()) / 1e6, 1)

        return {"total": megabytes(self.path), "checkpoints": megabytes(self.checkpoint_dir)}

    def looks_like_run(self) -> bool:
        """Whether `mtrain fit` wrote this directory (any of its marks)."""
        return (
            self.overrides_file.is_file()
            or self.metrics_file.is_file()
            or self.checkpoint_dir.is_dir()
            or self.config_file.is_file()
            or self.failed_file.is_file()
        )


def enclosing_run(path: str | Path) -> RunDir | None:
    """The run directory that `path` lies in, at any depth (symbolic links resolved): the nearest
    directory above it holding config.yaml and checkpoints/, as `mtrain fit` leaves one; None
    when there is none. Commands that write a file given on the command line refuse to replace
    one of a run's with it."""
    for directory in Path(path).resolve().parents:
        run = RunDir(directory)
        if run.config_file.is_file() and run.checkpoint_dir.is_dir():
            return run
    return None


def training_checkpoint_of(path: str | Path) -> RunDir | None:
    """The run whose own training checkpoint `path` is (symbolic links resolved): `last.pt`,
    `best.pt` or `update_<N>.pt` in its checkpoints/, which training writes and a resume reads;
    None for any other path (`average_lastN.pt` beside them included)."""
    resolved = Path(path).resolve()
    run = enclosing_run(resolved)
    if run is None or resolved.parent != run.checkpoint_dir.resolve():
        return None
    return run if resolved.name in ("last.pt", "best.pt") or _UPDATE_NAME.match(resolved.name) else None


class RunLock:
    """The one writer of a run directory: an exclusive `flock` on its `.lock` file.

    The kernel holds the lock for the open file, so it goes with the process however that
    ends (SIGKILL and power loss included): a crashed run never blocks its resume, unlike a
    PID file. The file holds the holder's pid and host, for the message of the one refused.
    Readers (translate, eval) never take it. The holder removes the file when it lets go;
    whoever locks a file that was removed meanwhile tries again, so two never both hold it.
    """

    def __init__(self, run: RunDir) -> None:
        self.run = run
        self._fd: int | None = None

    def acquire(self) -> None:
        """Hold the lock, or raise MtrainError naming the process that holds it (nothing
        is written then: the holder's file is opened, never changed)."""
        import fcntl

        path = self.run.lock_file
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 256).decode("utf-8", "replace").split()
                os.close(fd)
                raise MtrainError(
                    f"{self.run.path} is in use by {_describe_holder(holder)}; wait for it to "
                    "end, or choose another hydra.run.dir"
                ) from None
            except BaseException:
                os.close(fd)
                raise
            try:
                same_file = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same_file = False
            if same_file:
                break
            os.close(fd)  # its holder removed it as we opened it: lock the new one
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        """Remove the file, then let go (in that order: see the class docstring)."""
        if self._fd is None:
            return
        try:
            os.unlink(self.run.lock_file)
        except FileNotFoundError:
            pass
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def _describe_holder(holder: list[str]) -> str:
    if not holder:
        return "another process"  # it is writing its pid this very moment
    pid, host = holder[0], holder[1] if len(holder) > 1 else ""
    where = "this machine" if host in ("", socket.gethostname()) else f"host {host}"
    return f"process {pid} on {where}"
