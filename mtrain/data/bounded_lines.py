"""Reading text line by line with a bound on each line's length, and counting lines in blocks.

A file of one 1 GB line, or a device that never sends a newline (/dev/zero), would otherwise
be read into memory whole before anything could refuse it. Here a line is read at most
`max_line_chars` characters' worth of bytes at a time (UTF-8: at most 4 bytes a character), so
what is held stays bounded, and a longer line is refused at once with one line naming the file,
the line and the key that sets the bound (`max_line_chars` of translate and eval).

Line counting (a progress bar's total, a report's file record) reads 1 MiB blocks rather than
lines, so a file of one huge line costs no more memory than any other; devices and pipes are
not counted (they may never end, and reading them would consume the input).
"""

from __future__ import annotations

import gzip
import stat
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from mtrain.errors import MtrainError

MAX_UTF8_BYTES = 4  # bytes of the longest UTF-8 character
BLOCK_BYTES = 1 << 20
MAX_LINE_KEY = "max_line_chars"


class LineReader(Protocol):
    """What lines are read from: an open binary file, gzip file or stdin's buffer."""

    def readline(self, size: int = -1, /) -> bytes: ...


def line_too_long(where: str, number: int, max_chars: int) -> MtrainError:
    """The refusal of line `number` of `where` (a file name, or `stdin`)."""
    return MtrainError(
        f"{where}:{number}: a line of more than {max_chars:,} characters ({MAX_LINE_KEY}={max_chars}); "
        f"a line is one sentence or paragraph: split the text into lines, or raise {MAX_LINE_KEY}"
    )


def bounded_lines(handle: LineReader, where: str, max_chars: int) -> Iterator[bytes]:
    """The raw lines of `handle` (each with its b"\\n"; the last may lack it), read so that no
    more than about `max_chars` characters of a line are ever held; MtrainError naming
    `where:line` and `max_line_chars` for a longer line."""
    limit = max_chars * MAX_UTF8_BYTES + 2  # + "\r\n"
    number = 0
    while True:
        raw = handle.readline(limit)
        if not raw:
            return
        number += 1
        if len(raw) == limit and not raw.endswith(b"\n"):
            raise line_too_long(where, number, max_chars)  # more bytes than max_chars characters can take
        check_line_length(raw, where, number, max_chars)
        yield raw


def check_line_length(line: bytes, where: str, number: int, max_chars: int) -> None:
    """Refuse line `number` of `where` when `line` (all of it, or as much as has arrived:
    readers that gather a line from os.read() calls themselves check it as it grows) holds more
    than `max_chars` characters; a `\\r\\n` or `\\n` end is no part of it, and a byte that is not
    UTF-8 counts as one character, as it becomes one U+FFFD."""
    if len(line) <= max_chars:
        return  # no more characters than bytes: most lines end here, undecoded
    body = line.rstrip(b"\n").rstrip(b"\r")
    if len(body) > max_chars * MAX_UTF8_BYTES or len(body.decode("utf-8", errors="surrogateescape")) > max_chars:
        raise line_too_long(where, number, max_chars)


def is_regular_file(path: str | Path) -> bool:
    """Whether `path` is a regular file (not a device, a pipe, a socket or a directory)."""
    try:
        return stat.S_ISREG(Path(path).stat().st_mode)
    except OSError:
        return False


def count_lines(path: str | Path) -> int | None:
    """Lines of a plain or gzip (`.gz`) regular file, counted as they are read (a last line
    without its newline counts) in 1 MiB blocks; None for a device or a pipe, which may not
    end (/dev/zero) and which counting would consume."""
    path = Path(path)
    if not is_regular_file(path):
        return None
    lines, last = 0, b"\n"
    try:
        with gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb") as handle:
            while block := handle.read(BLOCK_BYTES):
                lines += block.count(b"\n")
                last = block[-1:]
    except (OSError, EOFError, zlib.error) as error:
        raise MtrainError(
            f"{path}: unreadable after {lines} lines ({error}); the file is corrupted or truncated: "
            "download or decompress it again (`gzip -t` checks a .gz file)"
        ) from error
    return lines + (last != b"\n")
