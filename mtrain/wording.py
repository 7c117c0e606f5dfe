"""How counts read in messages: "1 line", "2 lines", "1,000 sentences"."""

from __future__ import annotations


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """`count` with `noun` in agreement, thousands separated: counted(1, "line") is "1 line"."""
    return f"{count:,} {noun if count == 1 else plural or noun + 's'}"
