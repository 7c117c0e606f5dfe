"""The raw text of a run's evaluation split (sources and references) and file fingerprints.

A report names the exact files it scored against, with SHA-256 hashes, so a reader can
check that two numbers were computed on the same test set.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from mtrain.errors import MtrainError
from mtrain.evaluate.metrics import read_lines

SPLITS = ("valid", "test")


@dataclass
class SplitText:
    """Line-aligned sources and reference streams (`references[k][i]`) of one split."""

    sources: List[str]
    references: List[List[str]]
    files: List[Dict[str, Any]] = field(default_factory=list)  # {role, path, sha256, lines}


def file_record(path: Path, role: str) -> Dict[str, Any]:
    """Where a file is, its SHA-256 and line count."""
    path = Path(path)
    digest = hashlib.sha256()
    lines = 0
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
            lines += block.count(b"\n")
    return {"role": role, "path": str(path.resolve()), "sha256": digest.hexdigest(), "lines": lines}


def text_record(lines: Sequence[str], role: str, origin: str) -> Dict[str, Any]:
    """The fingerprint of text that exists only in memory (e.g. read from the Hub)."""
    digest = hashlib.sha256("".join(line + "\n" for line in lines).encode("utf-8")).hexdigest()
    return {"role": role, "path": origin, "sha256": digest, "lines": len(lines)}


def read_split_text(data_cfg: Any, split: str) -> SplitText:
    """Read split `valid` or `test` of a run's `data` config from its local files.

    Local files are found as `mtrain fit` finds them: `data.local_dir`, else
    `$MTRAIN_DATA_DIR/<data.name>`, with `data.pattern` (`.gz` tried too).
    """
    if split not in SPLITS:
        raise MtrainError(f"split={split}: choose one of {'|'.join(SPLITS)}")
    split_name = data_cfg.splits[split]
    directory = _local_dir(data_cfg)
    if directory is None:
        raise MtrainError(
            f"data.local_dir is not set and $MTRAIN_DATA_DIR/{data_cfg.name} does not exist, so the "
            f"{split} split's text cannot be read; pass the references with ref=FILE"
            + (" (and the hypotheses with hyp=FILE)" if data_cfg.get("hub", {}).get("id") else "")
        )
    fmt = data_cfg.get("format", "text")
    if fmt != "text":
        return _read_structured(directory, data_cfg, split_name, fmt)
    src_path = _find(directory, data_cfg.pattern.format(split=split_name, lang=data_cfg.src))
    ref_path = _find(directory, data_cfg.pattern.format(split=split_name, lang=data_cfg.tgt))
    sources = read_lines(src_path, "source")
    references = read_lines(ref_path, "reference")
    if len(sources) != len(references):
        raise MtrainError(f"{src_path} has {len(sources)} lines but {ref_path} has {len(references)}")
    return SplitText(sources, [references], [file_record(src_path, "source"), file_record(ref_path, "reference")])


def _local_dir(data_cfg: Any) -> Optional[Path]:
    if data_cfg.get("local_dir"):
        return Path(os.path.expanduser(str(data_cfg.local_dir)))
    env = os.environ.get("MTRAIN_DATA_DIR")
    if env and (Path(env) / data_cfg.name).is_dir():
        return Path(env) / data_cfg.name
    return None


def _find(directory: Path, name: str) -> Path:
    for candidate in (directory / name, directory / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    raise MtrainError(f"{directory / name}: no such file (nor .gz); check data.local_dir and data.pattern")


def _read_structured(directory: Path, data_cfg: Any, split_name: str, fmt: str) -> SplitText:
    import json

    path = _find(directory, data_cfg.pattern.format(split=split_name, lang=""))
    sources, references = [], []
    for number, line in enumerate(read_lines(path, "data"), 1):
        if fmt == "tsv":
            fields = line.split("\t")
            if len(fields) < 2:
                raise MtrainError(f"{path}:{number}: expected source<TAB>target")
            sources.append(fields[0].strip())
            references.append(fields[1].strip())
        elif fmt == "jsonl":
            try:
                record = json.loads(line)
                sources.append(str(record[data_cfg.src]).strip())
                references.append(str(record[data_cfg.tgt]).strip())
            except (json.JSONDecodeError, KeyError, TypeError) as error:
                raise MtrainError(f"{path}:{number}: expected a JSON object with keys "
                                  f"{data_cfg.src!r} and {data_cfg.tgt!r}") from error
        else:
            raise MtrainError(f"data.format={fmt}: choose text, tsv or jsonl")
    return SplitText(sources, [references], [file_record(path, "source+reference")])


def read_reference_files(paths: Sequence[str]) -> SplitText:
    """References given on the command line (`ref=FILE` or `ref=[FILE1,FILE2]`)."""
    streams = [read_lines(path, "ref") for path in paths]
    for path, stream in zip(paths[1:], streams[1:]):
        if len(stream) != len(streams[0]):
            raise MtrainError(f"ref={path} has {len(stream)} lines but ref={paths[0]} has {len(streams[0])}")
    return SplitText([], streams, [file_record(Path(path), "reference") for path in paths])
