"""The raw text of a run's evaluation split (sources and references) and file fingerprints.

A report names the exact files it scored against, with SHA-256 hashes, so a reader can
check that two numbers were computed on the same test set.

A multilingual run's split is one per direction: `read_run_split(..., direction=("de", "fr"))`
reads the copy `mtrain fit` kept of a direction it trained (data/test.de-fr.{src,ref}); a
direction it never trained (zero-shot: de->fr from a model trained on de<->en and fr<->en)
is read from the run's corpus with those languages, as `mtrain fit` reads a direction's
split: data.src/data.tgt replaced (Multi30k is aligned in German, English and French).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mtrain.config import DEFAULT_MAX_LINE_CHARS, DataConfig, with_values
from mtrain.data.bounded_lines import count_lines
from mtrain.errors import MtrainError
from mtrain.evaluate.metrics import aligned_lines, read_lines
from mtrain.rundir import RunDir

SPLITS = ("valid", "test")


@dataclass
class SplitText:
    """Line-aligned sources and reference streams (`references[k][i]`) of one split."""

    sources: list[str]
    references: list[list[str]]
    files: list[dict[str, Any]] = field(default_factory=list)  # {role, path, sha256, lines}
    skipped: int = 0  # pairs left out because a side was not valid UTF-8


def file_record(path: Path, role: str) -> dict[str, Any]:
    """Where a file is, the SHA-256 of its bytes (compressed, for a `.gz`) and its lines of text."""
    path = Path(path)
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return {"role": role, "path": str(path.resolve()), "sha256": digest.hexdigest(), "lines": count_lines(path)}


def text_record(lines: Sequence[str], role: str, origin: str) -> dict[str, Any]:
    """The fingerprint of text that exists only in memory (e.g. read from the Hub)."""
    digest = hashlib.sha256("".join(line + "\n" for line in lines).encode("utf-8")).hexdigest()
    return {"role": role, "path": origin, "sha256": digest, "lines": len(lines)}


def read_run_split(
    run: RunDir, data_cfg: DataConfig, split: str, direction: tuple[str, str] | None = None
) -> SplitText:
    """A run's `valid` or `test` split: the copy `mtrain fit` kept in the run directory, so a
    score never depends on where the corpus is now (or on reaching the Hub again); runs
    written before mtrain kept that copy read the split as their data config says.

    `direction` (src, tgt): that direction's split, of a multilingual run (see the module
    docstring); None: the run's one direction."""
    if split not in SPLITS:
        raise MtrainError(f"split={split}: choose one of {'|'.join(SPLITS)}")
    if getattr(data_cfg.splits, split) is None:
        raise MtrainError(
            f"run={run.path}: trained without a {split} split (data.splits.{split}=null); "
            "score split=valid, or a file with hyp=... ref=..."
        )
    src_path, ref_path = run.split_files(split, None if direction is None else "-".join(direction))
    if src_path.is_file() and ref_path.is_file():
        return SplitText(
            read_lines(src_path, "source"),
            [read_lines(ref_path, "reference")],
            [file_record(src_path, "source"), file_record(ref_path, "reference")],
        )
    if direction is not None:  # data's own split in those languages, as preparation reads a direction's
        data_cfg = with_values(data_cfg, src=direction[0], tgt=direction[1], corpora=[])
    return read_split_text(data_cfg, split)


def read_split_text(data_cfg: DataConfig, split: str) -> SplitText:
    """Split `valid` or `test` of a run's `data` config, read as `mtrain fit` reads it
    (`mtrain.data`: local files or the Hub, trimmed, undecodable pairs per data.invalid_utf8)."""
    from mtrain.data.sources import ReadStats, resolve_source

    if split not in SPLITS:
        raise MtrainError(f"split={split}: choose one of {'|'.join(SPLITS)}")
    source = resolve_source(data_cfg)
    stats = ReadStats()
    pairs = list(source.pairs(split, stats))
    sources = [src for src, _ in pairs]
    references = [tgt for _, tgt in pairs]
    if hasattr(source, "files"):  # local files: fingerprint the files themselves
        paths = source.files(split)
        roles = ["source", "reference"] if len(paths) == 2 else ["source+reference"]
        records = [file_record(path, role) for path, role in zip(paths, roles, strict=True)]
    else:
        records = [
            text_record(sources, "source", source.description),
            text_record(references, "reference", source.description),
        ]
    return SplitText(sources, [references], records, skipped=stats.invalid_utf8)


def read_reference_files(paths: Sequence[str], max_chars: int = DEFAULT_MAX_LINE_CHARS) -> SplitText:
    """References given on the command line (`ref=FILE` or `ref=[FILE1,FILE2]`), read side by
    side (files of different lengths are refused where the shorter ends)."""
    rows = list(aligned_lines([("ref", path) for path in paths], max_chars))
    streams = [list(stream) for stream in zip(*rows, strict=True)] if rows else [[] for _ in paths]
    return SplitText([], streams, [file_record(Path(path), "reference") for path in paths])
