"""The vocabulary of corpus reading shared by every source: splits, pairs, what reading
repaired, and the one rule that makes a sentence safe for line-based files."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

SPLITS = ("train", "valid", "test")
Pair = tuple[str, str]


@dataclass
class ParallelText:
    """Raw sentences of a validation/test split: sources to translate, references to score."""

    src: list[str] = field(default_factory=list)
    tgt: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.src)


@dataclass
class ReadStats:
    """What reading a split had to repair or skip."""

    pairs: int = 0  # pairs delivered
    invalid_utf8: int = 0  # pairs skipped because a side was not valid UTF-8
    first_invalid: str | None = None  # "file:line" of the first one
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
