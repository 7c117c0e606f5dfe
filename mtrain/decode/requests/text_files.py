"""The small UTF-8 text files a request names beside its input (`terms=`, `avoid=`), read as
their editors mean them.

Here, below the commands' text I/O (`mtrain.decode.text.textio`), because the request layer
(glossaries, avoided phrases) reads them and must not import the layer above it.
"""

from __future__ import annotations

import re
from pathlib import Path

from mtrain.errors import MtrainError


def read_text_lines(path: str | Path, key: str) -> list[str]:
    """The lines of a small UTF-8 text file the command reads (`key=path`: terms, avoid) exactly
    as written: a line may end in `\\n`, `\\r\\n` or `\\r` (Python's universal newlines) and a
    byte-order mark at a line's start is dropped (as in the input), so a file saved on Windows
    means what it says. MtrainError naming `key=path` when the file cannot be read, is not
    UTF-8, or holds a U+FEFF inside a line, where dropping or keeping it would change an entry."""
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise MtrainError(f"{key}={path}: cannot read it ({error})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        number = data[: error.start].count(b"\n") + 1
        raise MtrainError(f"{key}={path} line {number}: cannot read it: not UTF-8; save it as UTF-8") from None
    lines = [line.removeprefix("\ufeff") for line in re.split("\r\n|\r|\n", text)]
    if lines[-1] == "":
        lines.pop()  # the end of the last line, not an empty line after it
    for number, line in enumerate(lines, start=1):
        if "\ufeff" in line:
            raise MtrainError(
                f"{key}={path} line {number}: a byte-order mark (U+FEFF) inside the line, column "
                f"{line.index(chr(0xFEFF)) + 1}; remove it (it would be part of an entry)"
            )
    return lines
