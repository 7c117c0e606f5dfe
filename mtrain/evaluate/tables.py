"""Tables as plain rows of strings, rendered for the terminal or as Markdown."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Table:
    headers: list[str]
    rows: list[list[str]] = field(default_factory=list)

    def add(self, *cells: object) -> None:
        self.rows.append([format_cell(cell) for cell in cells])

    def to_markdown(self) -> str:
        def line(cells: list[str]) -> str:
            return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

        out = [line(self.headers), "|" + "|".join("---" for _ in self.headers) + "|"]
        return "\n".join(out + [line(row) for row in self.rows])

    def to_text(self) -> str:
        widths = [len(h) for h in self.headers]
        for row in self.rows:
            widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]

        def line(cells: list[str]) -> str:
            return "  ".join(cell.ljust(w) for cell, w in zip(cells, widths, strict=True)).rstrip()

        rule = "  ".join("-" * w for w in widths)
        return "\n".join([line(self.headers), rule] + [line(row) for row in self.rows])


_MARKDOWN_SPECIALS = "\\`*_[]<>~&"  # backslash first: the escapes added after it stay escapes


def markdown_text(text: str) -> str:
    """Plain text as it reads in a Markdown table cell: its Markdown and HTML characters
    backslash-escaped, line breaks and tabs as spaces (`Table.to_markdown` escapes `|`)."""
    for character in _MARKDOWN_SPECIALS:
        text = text.replace(character, "\\" + character)
    return text.replace("\t", " ").replace("\r", " ").replace("\n", " ")


def format_cell(value: object, digits: int = 2) -> str:
    """Numbers with a fixed number of decimals, booleans as yes/no, missing as '-'."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = float(seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.2f}h"
