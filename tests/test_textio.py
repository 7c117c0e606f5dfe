"""The files `mtrain translate` reads beside its model (mtrain.decode.text.textio, mtrain.decode.requests.text_files): a UTF-8 byte-order
mark and CRLF line ends, as Windows editors write them, mean what they say in the input, the
prefixes, the terms and the avoided phrases; what would change an entry is refused naming the
file. Through the real command where the issue asked (a BOM'd or CRLF terms file applies its
first term)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from mtrain.decode.requests.controls import read_phrases
from mtrain.decode.requests.terminology import read_glossary
from mtrain.decode.requests.text_files import read_text_lines
from mtrain.errors import MtrainError
from tests.decoding_run import TRANSLATE_DECODE as DECODE
from tests.warm_process import run_mtrain

BOM = b"\xef\xbb\xbf"


def test_a_byte_order_mark_and_crlf_are_no_part_of_an_entry(tmp_path):
    terms, avoid = tmp_path / "terms.tsv", tmp_path / "avoid.txt"
    terms.write_bytes(BOM + b"Hund\tdog\r\n# note\r\nMann\tman\r\n")
    avoid.write_bytes(BOM + b"cat\r\nbig  dog\r")
    assert read_glossary(terms).constraints("Ein Hund und ein Mann") == ["dog", "man"]
    assert read_phrases(avoid) == ("cat", "big dog")
    lines = tmp_path / "lines.txt"
    lines.write_bytes(b"a\rb\r\n" + BOM + b"c\n\n")  # old Mac, Windows, a BOM where files were joined
    assert read_text_lines(lines, "avoid") == ["a", "b", "c", ""]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            "Hund\tdog\nKatze\ufeff\tcat\n".encode(),
            "terms={} line 2: a byte-order mark (U+FEFF) inside the line, column 6",
        ),
        (b"Hund\tdog\n\xff\tcat\n", "terms={} line 2: cannot read it: not UTF-8; save it as UTF-8"),
    ],
)
def test_what_would_change_an_entry_is_refused_naming_the_file(tmp_path, data, message):
    terms = tmp_path / "terms.tsv"
    terms.write_bytes(data)
    with pytest.raises(MtrainError, match=re.escape(message.format(terms))):
        read_glossary(terms)


def translate(run_dir: Path, cwd: Path, *args: str) -> list[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = run_mtrain("translate", f"run={run_dir}", *DECODE, *args, cwd=cwd, env=env, timeout=120)
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout.decode().splitlines()


def write(path: Path, text: str, variant: str) -> Path:
    data = text.replace("\n", "\r\n" if variant == "crlf" else "\n").encode()
    path.write_bytes(BOM + data if variant == "bom" else data)
    return path


@pytest.mark.parametrize("variant", ["bom", "crlf"])
def test_translate_reads_windows_files_as_plain_ones(run_dir, tmp_path, variant):
    """The terms' first entry applies (a BOM used to spoil it), and input, prefixes and
    terms give exactly the output of the same files written plainly."""
    texts = {"in.txt": "Ein Hund.\nEin Mann mit Hut.\n", "prefix.txt": "A\n\n", "terms.tsv": "Hund\tdog\nHut\that\n"}
    plain = {name: write(tmp_path / f"plain_{name}", text, "plain") for name, text in texts.items()}
    windows = {name: write(tmp_path / f"{variant}_{name}", text, variant) for name, text in texts.items()}

    def run(files: dict[str, Path]) -> list[str]:
        return translate(
            run_dir,
            tmp_path,
            f"input={files['in.txt']}",
            f"prefix={files['prefix.txt']}",
            f"terms={files['terms.tsv']}",
        )

    outputs = run(windows)
    assert outputs == run(plain)
    assert "dog" in outputs[0] and outputs[0].startswith("A")
    assert "hat" in outputs[1]
