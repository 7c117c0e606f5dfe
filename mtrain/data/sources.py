"""Where a parallel corpus comes from, decided once: local files or the Hugging Face Hub.

Resolution when the user names no path: `data.local_dir` if set, else
`$MTRAIN_DATA_DIR/<data.name>` if it holds the corpus, else `data.hub.id`. When nothing can
be read, the error lists every place that was tried and how to point mtrain at the data.

Every source streams `(source sentence, target sentence)` pairs of one split (our names:
train, valid, test) and has a cheap fingerprint of that split, used as a cache key.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional, Protocol, Tuple

from mtrain.errors import MtrainError

SPLITS = ("train", "valid", "test")
Pair = Tuple[str, str]


@dataclass
class ParallelText:
    """Raw sentences of a validation/test split: sources to translate, references to score."""

    src: List[str] = field(default_factory=list)
    tgt: List[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.src)


@dataclass
class ReadStats:
    """What reading a split had to repair or skip."""

    pairs: int = 0  # pairs delivered
    invalid_utf8: int = 0  # pairs skipped because a side was not valid UTF-8
    first_invalid: Optional[str] = None  # "file:line" of the first one
    nul_lines: int = 0  # lines from which NUL bytes were removed

    def report(self, split: str, log: Callable[[str], Any]) -> None:
        if self.invalid_utf8:
            log(
                f"data: {split}: skipped {self.invalid_utf8} pairs that are not valid UTF-8 "
                f"(first at {self.first_invalid}); data.invalid_utf8=error makes this fatal"
            )
        if self.nul_lines:
            log(f"data: {split}: removed NUL bytes from {self.nul_lines} lines")


class ParallelSource(Protocol):
    description: str  # for logs: where the data is read from

    def fingerprint(self, split: str) -> str:
        """Changes whenever the split's content may have changed (paths, sizes, mtimes...);
        the same for both directions (the direction is part of cache keys where it matters)."""

    def pairs(self, split: str, stats: ReadStats) -> Iterator[Pair]:
        """Stream the split's (src, tgt) sentences in corpus order, whitespace-trimmed."""


def clean_text(text: str, stats: ReadStats) -> str:
    """Make one sentence safe for line-based files: no NULs, no line breaks, trimmed."""
    if "\x00" in text:
        stats.nul_lines += 1
        text = text.replace("\x00", "")
    if "\n" in text or "\r" in text:
        text = text.replace("\r\n", " ").replace("\n", " ").replace("\r", " ")
    return text.strip()


def check_data_config(cfg: Any) -> None:
    """Reject settings that would only fail later, naming the key."""
    if cfg.src == cfg.tgt:
        raise MtrainError(f"data.src and data.tgt are both '{cfg.src}'; choose two languages")
    if cfg.format not in ("text", "tsv", "jsonl"):
        raise MtrainError(f"data.format={cfg.format}: expected text, tsv or jsonl")
    if cfg.invalid_utf8 not in ("skip", "error"):
        raise MtrainError(f"data.invalid_utf8={cfg.invalid_utf8}: expected skip or error")
    if cfg.train_limit is not None and cfg.train_limit <= 0:
        raise MtrainError(f"data.train_limit={cfg.train_limit}: expected a positive number or null")
    if cfg.chunk_size <= 0 or cfg.num_workers <= 0:
        raise MtrainError("data.chunk_size and data.num_workers must be positive")


def resolve_source(cfg: Any) -> ParallelSource:
    """Pick the corpus location for `cfg` (a DataConfig) as the module docstring describes."""
    from mtrain.data.hub import HubSource
    from mtrain.data.local_files import LocalSource

    check_data_config(cfg)
    if cfg.local_dir:
        source = LocalSource(Path(cfg.local_dir).expanduser(), cfg)
        missing = source.missing_files()
        if missing:
            raise MtrainError(
                f"data.local_dir={cfg.local_dir}: missing {', '.join(missing)} "
                f"(data.format={cfg.format}, data.pattern='{cfg.pattern}', splits "
                f"{_split_names(cfg)}); fix data.local_dir, data.pattern or data.splits.*"
            )
        return source

    tried = ["data.local_dir is not set"]
    env_dir = os.environ.get("MTRAIN_DATA_DIR")
    if env_dir:
        directory = Path(env_dir).expanduser() / cfg.name
        if directory.is_dir():
            source = LocalSource(directory, cfg)
            missing = source.missing_files()
            if not missing:
                return source
            tried.append(f"$MTRAIN_DATA_DIR/{cfg.name} = {directory} lacks {', '.join(missing)}")
        else:
            tried.append(f"$MTRAIN_DATA_DIR/{cfg.name} = {directory} does not exist")
    else:
        tried.append("$MTRAIN_DATA_DIR is not set")

    if cfg.hub.id:
        return HubSource(cfg, tried)
    tried.append(f"no Hub dataset: data.hub.id is not set for data={cfg.name}")
    raise MtrainError(
        f"no corpus found for data={cfg.name} ({cfg.src}->{cfg.tgt}); tried: {'; '.join(tried)}. "
        f"Set data.local_dir=DIR (files {_example_files(cfg)}), or MTRAIN_DATA_DIR=DIR "
        f"holding DIR/{cfg.name}/, or data.hub.id=<Hugging Face dataset>"
    )


def _split_names(cfg: Any) -> str:
    return f"train={cfg.splits.train}, valid={cfg.splits.valid}, test={cfg.splits.test}"


def _example_files(cfg: Any) -> str:
    from mtrain.data.local_files import file_names

    names = [name for split in ("train", "valid") for name in file_names(cfg, split)]
    return ", ".join(f"{name}[.gz]" for name in names) + ", ..."
