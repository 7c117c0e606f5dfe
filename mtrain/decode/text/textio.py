"""Raw text in and out of `mtrain translate`: lines, undecodable bytes, n-best TSV (the small
text files the command reads beside its input, terms and avoided phrases, are read by
`mtrain.decode.requests.text_files`, which the request layer below this one uses too).

Input is read as bytes and split on b"\\n" only (a U+2028 inside a sentence does not make
two lines), so the output has exactly one line per input line; a `\\r` before the `\\n` (CRLF)
and a UTF-8 byte-order mark at the start of a line (the file's start, or where files were
joined) are no part of the line (the mark would be glued to the first word). Bytes that are
not UTF-8 become U+FFFD, one per byte, and are counted for a warning instead of stopping the
job.
A closed stdin or stdout, and a stdout that refuses writes (a full disk, /dev/full), are
MtrainErrors; a reader that goes away (BrokenPipeError) is left to the command.
"""

from __future__ import annotations

import io
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, BinaryIO, TextIO

from mtrain.data.bounded_lines import count_lines as count_file_lines
from mtrain.decode.search.hypothesis import Hypothesis
from mtrain.decode.translation.alignment import pharaoh
from mtrain.errors import MtrainError
from mtrain.rundir import atomic_write, enclosing_run

_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")
UTF8_BOM = b"\xef\xbb\xbf"  # what Windows editors write before UTF-8 text


@dataclass
class InputRepairs:
    """What reading `mtrain translate`'s input repaired, for the closing warnings (the corpus
    reader's counterpart is `mtrain.data.text.ReadStats`)."""

    lines: int = 0
    undecodable_bytes: int = 0
    undecodable_lines: int = 0
    first_undecodable_line: int | None = None  # 1-based


def check_streams(reads_stdin: bool, writes_stdout: bool) -> None:
    """Fail before any work if the input is stdin and the shell closed it (`<&-`), or the output
    is stdout and it is closed (`>&-`): Python sets sys.stdin/sys.stdout to None then."""
    if reads_stdin and sys.stdin is None:
        raise MtrainError("input: stdin is closed; give input=FILE, or pipe the text in")
    if writes_stdout and sys.stdout is None:
        raise MtrainError("output: stdout is closed; give output=FILE, or redirect stdout to a file")


def check_paths(input_path: str | None, output_path: str | None) -> None:
    """Fail before any work if the input is not a readable file or the output is a folder."""
    if input_path is not None:
        file = Path(input_path)
        if file.is_dir():
            raise MtrainError(
                f"input={input_path}: is a directory; give a text file (one sentence per line) or omit input= to read stdin"
            )
        if not file.exists():
            raise MtrainError(f"input={input_path}: no such file")
    if output_path is not None and Path(output_path).is_dir():
        raise MtrainError(f"output={output_path}: is a directory; give a file name")


def check_spares_what_it_reads(target: str | Path, label: str, reads: Sequence[tuple[str, str | None]]) -> None:
    """Fail before any work if writing the file `target` (named `label` in the message) would
    replace what the command reads or a run's own file: one of the files of `reads` ((key, path)
    pairs) by any of its names (a symbolic link, a hard link: the same inode), a file inside a
    directory of `reads` (run=, an ensemble member), or a file of any run directory."""
    target = Path(target)
    if not target.exists():
        return
    for key, read in reads:
        if read is None or not Path(read).exists():
            continue
        if Path(read).is_dir():
            if Path(read).resolve() in target.resolve().parents:
                raise MtrainError(f"{label} would replace a file of {key}={read}; {_ELSEWHERE}")
        elif os.path.samefile(target, read):
            another_name = "" if target.absolute() == Path(read).absolute() else " (the same file by another name)"
            raise MtrainError(f"{label} would replace {key}={read}{another_name}; {_ELSEWHERE}")
    run = enclosing_run(target)
    if run is not None:
        raise MtrainError(f"{label} would replace a file of the run directory {run.path}; {_ELSEWHERE}")


_ELSEWHERE = "write it elsewhere (nothing was written)"


def open_input(path: str | None) -> BinaryIO:
    """The input file as bytes, or stdin when `path` is None."""
    if path is None:
        check_streams(reads_stdin=True, writes_stdout=False)
        return sys.stdin.buffer
    check_paths(path, None)
    return Path(path).open("rb")


def decode_line(raw: bytes) -> tuple[str, int]:
    """A line's text and how many of its bytes were not UTF-8 (each became U+FFFD); a
    byte-order mark at its start is dropped."""
    raw = raw.removeprefix(UTF8_BOM)
    try:
        return raw.decode("utf-8"), 0
    except UnicodeDecodeError:
        text = raw.decode("utf-8", errors="surrogateescape")  # each bad byte -> one surrogate
        return _ESCAPED_BYTE.subn("\ufffd", text)


def read_chunks(stream: Iterable[bytes], chunk_lines: int, stats: InputRepairs) -> Iterator[list[str]]:
    """The input's lines (end-of-line stripped), `chunk_lines` at a time: a chunk is yielded as
    soon as its last line is read (a buffered stream returns a line as soon as it arrives)."""
    chunk: list[str] = []
    for raw in stream:
        stats.lines += 1
        text, bad = decode_line(raw.rstrip(b"\n").rstrip(b"\r"))
        if bad:
            stats.undecodable_bytes += bad
            stats.undecodable_lines += 1
            if stats.first_undecodable_line is None:
                stats.first_undecodable_line = stats.lines
        chunk.append(text)
        if len(chunk) >= chunk_lines:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def count_lines(path: str | None) -> int | None:
    """Lines in a file (for a progress bar's total); None for stdin, a device or a pipe."""
    return None if path is None else count_file_lines(path)


def write_output(path: str | None, produce: Callable[[TextIO], None]) -> None:
    """Call `produce(sink)` with stdout when `path` is None, else with a file that appears at
    `path` only once complete (`mtrain.rundir.atomic_write`): a full disk or an interrupted
    run never leaves a partial translation behind, nor harms an existing file there."""
    if path is None:
        _write_stdout(produce)
        return
    check_paths(None, path)
    file = Path(path)

    def write(handle: IO[bytes]) -> None:
        sink = io.TextIOWrapper(handle, encoding="utf-8", newline="\n")
        produce(sink)
        sink.flush()
        sink.detach()  # atomic_write fsyncs and closes the binary handle itself

    try:
        atomic_write(file, write)
    except OSError as error:
        raise MtrainError(
            f"output={path}: could not write ({error.strerror or error}); no output file was "
            "written (an earlier file there is intact)"
        ) from error


def _write_stdout(produce: Callable[[TextIO], None]) -> None:
    """`produce(sys.stdout)`, flushed; a write stdout refuses becomes an MtrainError."""
    check_streams(reads_stdin=False, writes_stdout=True)
    try:
        produce(sys.stdout)
        sys.stdout.flush()
    except BrokenPipeError:
        raise  # the reader went away (`| head`): the command stops quietly
    except OSError as error:
        # What is still buffered can never be written: drop it, or Python's flush at exit fails again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise MtrainError(
            f"output: could not write to stdout ({error.strerror or error}); the translations "
            "written so far are incomplete. Free space where stdout goes, or give output=FILE"
        ) from error


def one_line(text: str) -> str:
    """Text that cannot break the one-line-per-input rule."""
    return text.replace("\r", " ").replace("\n", " ")


def nbest_rows(index: int, hyps: list[Hypothesis], confidence: bool = False) -> list[str]:
    """n-best TSV rows `index<TAB>score<TAB>hypothesis`; index is the 0-based input line.
    The hypothesis' columns are `output_line`'s (its confidence, its links)."""
    return [f"{index}\t{hyp.score:.4f}\t{output_line(hyp, confidence)}" for hyp in hyps]


def output_line(hyp: Hypothesis, confidence: bool = False) -> str:
    """The hypothesis' text on one line; with `confidence` (translate's `confidence=true`),
    `<TAB>` and its confidence score (4 decimals; empty for a blank source: none); then `<TAB>`
    and its Pharaoh links when it has any (`decode.alignment`: Marian's and fairseq's users cut
    them off with `cut -f1`)."""
    columns = [one_line(hyp.text)]
    if confidence:
        columns.append("" if hyp.confidence is None else f"{hyp.confidence:.4f}")
    if hyp.alignment is not None:
        columns.append(pharaoh(hyp.alignment))
    return "\t".join(columns)
