"""mtrain.data.bounded_lines: lines read with a bound on their length, lines counted in blocks."""

from __future__ import annotations

import gzip
import io
import os
import threading

import pytest

from mtrain.data.bounded_lines import MAX_UTF8_BYTES, bounded_lines, check_line_length, count_lines
from mtrain.errors import MtrainError


def test_lines_come_back_as_written_up_to_the_bound():
    text = b"one\r\n" + "ä".encode() * 10 + b"\n\xff\xfe bad bytes\nlast, no newline"
    assert list(bounded_lines(io.BytesIO(text), "input=x", max_chars=16)) == text.splitlines(keepends=True)


@pytest.mark.parametrize(
    "line",
    [
        b"x" * 11,  # one character too many
        "ä".encode() * 11,  # 11 characters in 22 bytes
        b"\xff" * 11,  # bytes that are not UTF-8 count one each (each becomes U+FFFD)
        b"x" * (10 * MAX_UTF8_BYTES + 50),  # past what 10 characters can take in bytes: refused unread
    ],
)
def test_a_longer_line_is_refused_naming_where_its_number_and_the_key(line):
    lines = bounded_lines(io.BytesIO(b"short\n" + line + b"\nnever read\n"), "input=in.de", max_chars=10)
    assert next(lines) == b"short\n"
    with pytest.raises(MtrainError) as error:
        next(lines)
    assert str(error.value) == (
        "input=in.de:2: a line of more than 10 characters (max_line_chars=10); a line is one sentence "
        "or paragraph: split the text into lines, or raise max_line_chars"
    )


def test_a_line_of_exactly_the_bound_passes_with_its_crlf_end():
    line = "ü".encode() * 10 + b"\r\n"
    assert list(bounded_lines(io.BytesIO(line), "stdin", max_chars=10)) == [line]


class CountingReader(io.RawIOBase):
    """An endless stream of one line that never ends, counting the bytes it hands out."""

    def __init__(self) -> None:
        self.given = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        buffer[:] = b"a" * len(buffer)
        self.given += len(buffer)
        return len(buffer)


def test_an_endless_line_is_refused_after_reading_a_bounded_amount():
    endless = CountingReader()
    with pytest.raises(MtrainError, match=r"^stdin:1: a line of more than 1,000 characters"):
        next(bounded_lines(io.BufferedReader(endless), "stdin", max_chars=1000))
    assert endless.given <= 1000 * MAX_UTF8_BYTES + 2 + io.DEFAULT_BUFFER_SIZE


def test_dev_zero_is_refused_at_its_first_line():
    with open("/dev/zero", "rb") as zeros, pytest.raises(MtrainError, match=r"^input=/dev/zero:1: a line of more"):
        next(bounded_lines(zeros, "input=/dev/zero", max_chars=100_000))


def test_check_line_length_counts_characters_of_a_line_still_arriving():
    check_line_length("é".encode() * 5, "stdin", 3, max_chars=5)  # 10 bytes, 5 characters: fine
    with pytest.raises(MtrainError, match=r"^stdin:3: a line of more than 5 characters"):
        check_line_length("é".encode() * 6, "stdin", 3, max_chars=5)


@pytest.mark.parametrize(
    ("content", "lines"), [(b"", 0), (b"a\nb\n", 2), (b"a\nb", 2), (b"\n\n\n", 3), (b"x" * 3_000_000, 1)]
)
def test_count_lines_counts_as_lines_are_read(tmp_path, content, lines):
    plain, packed = tmp_path / "text.txt", tmp_path / "text.txt.gz"
    plain.write_bytes(content)
    packed.write_bytes(gzip.compress(content))
    assert count_lines(plain) == count_lines(packed) == lines == len(content.splitlines())


def test_count_lines_reads_nothing_of_a_device_or_a_pipe(tmp_path):
    assert count_lines("/dev/zero") is None
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    counted = []  # opening a FIFO with no writer would block: count it in a thread that may hang
    worker = threading.Thread(target=lambda: counted.append(count_lines(fifo)), daemon=True)
    worker.start()
    worker.join(timeout=5)
    assert counted == [None]


def test_count_lines_of_a_corrupt_gzip_is_one_line(tmp_path):
    broken = tmp_path / "broken.txt.gz"
    broken.write_bytes(gzip.compress(b"a\n" * 100_000)[:-20])
    with pytest.raises(MtrainError, match=r"broken\.txt\.gz: unreadable after .* lines"):
        count_lines(broken)
