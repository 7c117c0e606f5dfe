"""Where a synthetic corpus came from: the record `mtrain translate output=FILE` writes beside FILE.

`FILE.mtrain.json` names the model that produced FILE (the run directory, the checkpoint(s)
with their sha256), the decode settings (beam or sampling), the input file with its sha256,
mtrain's version and the time. When a training corpus's files have such a record (a
back-translated or distilled corpus in `data.corpora`), preparation copies it into the run's
metrics.json, so a run trained on synthetic data says which model made that data.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SUFFIX = ".mtrain.json"


def provenance_path(output: Path) -> Path:
    """`FILE.mtrain.json` beside `FILE` (for `x.de.gz`, `x.de.gz.mtrain.json`)."""
    return output.with_name(output.name + SUFFIX)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_provenance(
    output: Path, run: str, checkpoints: Sequence[Path], decode: dict[str, Any], input_path: str | None, version: str
) -> Path:
    """Write the record of `mtrain translate`'s `output` (see the module docstring)."""
    record = {
        "output": str(Path(output).absolute()),
        "output_sha256": file_sha256(Path(output)),
        "run": str(Path(run).absolute()),
        "checkpoints": [
            {"path": str(Path(path).absolute()), "sha256": file_sha256(Path(path))} for path in checkpoints
        ],
        "decode": decode,
        "input": str(Path(input_path).absolute()) if input_path else None,
        "input_sha256": file_sha256(Path(input_path)) if input_path else None,
        "mtrain_version": version,
        "time": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    }
    path = provenance_path(Path(output))
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def read_provenance(path: Path) -> dict[str, Any] | None:
    """The record beside corpus file `path` (also for `x.gz` made from a translated `x`);
    None when there is none. A record whose output checksum no longer matches the file says
    so (`"matches": false`): the file was changed after `mtrain translate` wrote it."""
    candidates: list[Path] = [provenance_path(path)]
    if path.name.endswith(".gz"):
        candidates.append(provenance_path(path.with_name(path.name[:-3])))
    for candidate in candidates:
        if candidate.is_file():
            try:
                record = json.loads(candidate.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                return {"file": str(path), "record": str(candidate), "error": "unreadable provenance record"}
            if not isinstance(record, dict):
                return {"file": str(path), "record": str(candidate), "error": "not a JSON object"}
            matches = candidate == provenance_path(path) and record.get("output_sha256") == file_sha256(path)
            return {"file": str(path), "record": str(candidate), "matches": matches, **record}
    return None
