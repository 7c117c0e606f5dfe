"""Where an export is written: the mark every export leaves, and what `force=true` may replace.

Every format marks what it wrote, so that a later export (of any format) knows it:

    a directory (format=ctranslate2, format=hf)   mtrain_export.json: its "format", the "files"
                                                  it wrote, where the weights came from
    an Argos package (format=argos: a zip file)   its folder's metadata.json, with an "mtrain" record

`check_export_target` is the one rule of every format, checked before any work: a new `out` is
written; an existing one is replaced with `force=true` only when it is such an export holding
nothing else; anything else (the run, a directory holding it, a user's folder or file, a
symbolic link) is refused in one line naming `out` and why, whatever force says. Every format
then builds its output beside `out` and renames it into place (`mtrain.rundir.staged`).
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from typing import Any

from mtrain.errors import MtrainError
from mtrain.rundir import EXPORT_METADATA_FILE, export_format

RECORD_FILE = EXPORT_METADATA_FILE
# The most metadata.json may hold to be read: an mtrain package's is under 1 kB.
_METADATA_LIMIT = 1 << 20


def check_export_target(out: Path, force: bool, run_dir: Path | None = None) -> None:
    """Refuse, before any work, an `out` the export may not write: with or without `force`, an
    existing one that is not an export (see the module docstring); without `force`, an export
    (or an empty directory)."""
    out = Path(out)
    if not (out.exists() or out.is_symlink()):
        return
    reason = not_an_export(out, run_dir)
    if reason is not None:
        raise MtrainError(
            f"out={out}: {reason}; an export replaces only a previous export (a directory holding {RECORD_FILE}, "
            "or an Argos package mtrain wrote), whatever force says: choose another out (nothing was written)"
        )
    if not force:
        kind = "file" if out.is_file() else "directory"
        raise MtrainError(f"out={out}: already exists; choose another {kind} or pass force=true")


def not_an_export(out: Path, run_dir: Path | None = None) -> str | None:
    """Why the existing `out` is no export that `force` may replace; None when it is one."""
    if out.is_symlink():
        return "is a symbolic link"
    if run_dir is not None and Path(run_dir).is_dir():
        run, resolved = Path(run_dir).resolve(), out.resolve()
        if resolved == run:
            return f"is run={run_dir} itself"
        if resolved in run.parents:
            return f"holds run={run_dir}"
    if out.is_file():
        if is_argos_package(out):
            return None
        return "is not an Argos package `mtrain export` wrote" if out.suffix == ".argosmodel" else "is a file"
    if not out.is_dir():
        return "is neither a file nor a directory"
    if not any(out.iterdir()):
        return None  # nothing to lose
    if export_format(out) is None:
        return "is not a directory `mtrain export` wrote"
    return _unrecorded_files(out)


def _unrecorded_files(directory: Path) -> str | None:
    """Why an export directory holds more than its export wrote; None when it does not."""
    try:
        record = json.loads((directory / RECORD_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        record = None
    written = record.get("files") if isinstance(record, dict) else None
    if not isinstance(written, list):  # written before exports listed their files
        for folder, subfolders, files in os.walk(directory):
            if "checkpoints" in subfolders or any(name.endswith(".pt") for name in files):
                return f"holds a checkpoint or a run ({folder})"
        return None
    others = sorted(set(export_files(directory)) - set(written) - {RECORD_FILE})
    if others:
        more = f" and {len(others) - 1} more" if len(others) > 1 else ""
        return f"holds {others[0]}{more}, which `mtrain export` did not write"
    return None


def export_files(directory: Path) -> list[str]:
    """The files (and links) under `directory`, as POSIX paths relative to it."""
    return sorted(
        path.relative_to(directory).as_posix()
        for path in directory.rglob("*")
        if path.is_symlink() or not path.is_dir()
    )


def write_record(directory: Path, record: dict[str, Any]) -> None:
    """Mark `directory` as an export: its RECORD_FILE holds `record` and the files written so far."""
    files = [name for name in export_files(directory) if name != RECORD_FILE]
    text = json.dumps({**record, "files": files}, indent=2) + "\n"
    (directory / RECORD_FILE).write_text(text, encoding="utf-8")


def is_argos_package(path: Path) -> bool:
    """Whether `path` is an Argos package mtrain wrote: a zip of one folder whose metadata.json
    has mtrain's record."""
    try:
        with zipfile.ZipFile(path) as archive:
            entries = [
                info
                for info in archive.infolist()
                if info.filename.count("/") == 1 and info.filename.endswith("/metadata.json")
            ]
            if len(entries) != 1 or entries[0].file_size > _METADATA_LIMIT:
                return False
            metadata = json.loads(archive.read(entries[0]))
    except (OSError, ValueError, zipfile.BadZipFile):
        return False
    return isinstance(metadata, dict) and isinstance(metadata.get("mtrain"), dict)
