"""scripts/align_eflomal.py: the symmetrisation by hand, and eflomal end to end on a few lines."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "align_eflomal.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("align_eflomal", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("align_eflomal", module)
    spec.loader.exec_module(module)
    return module


# Both directions agree on 0-0 and 1-1; forward adds 1-2 (a neighbour), 3-5 (two free words)
# and 0-4 (source word 0 is taken); backward adds 2-2 (a neighbour of 1-2 once grown).
FORWARD = {(0, 0), (1, 1), (1, 2), (3, 5), (0, 4)}
BACKWARD = {(0, 0), (1, 1), (2, 2)}


def test_grow_diag_final_and_by_hand(script):
    assert script.symmetrise(FORWARD, BACKWARD, "intersection") == {(0, 0), (1, 1)}
    assert script.symmetrise(FORWARD, BACKWARD, "union") == FORWARD | BACKWARD
    assert script.symmetrise(FORWARD, BACKWARD, "grow-diag-final-and") == {(0, 0), (1, 1), (1, 2), (2, 2), (3, 5)}
    # final (not -and) also takes a link one of whose words is still free: 0-4
    assert script.symmetrise(FORWARD, BACKWARD, "grow-diag-final") == {(0, 0), (1, 1), (1, 2), (2, 2), (3, 5), (0, 4)}


def test_eflomal_aligns_every_pair_and_splits_the_outputs_again(script, tmp_path):
    pytest.importorskip("eflomal")
    src = ["ein hund läuft", "ein mann läuft", "der hund schläft", "", "ein mann schläft"] * 4
    tgt = ["a dog runs", "a man runs", "the dog sleeps", "nothing", "a man sleeps"] * 4
    for name, lines in (("a.de", src[:15]), ("a.en", tgt[:15]), ("b.de", src[15:]), ("b.en", tgt[15:])):
        (tmp_path / name).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    args = ["--src", *(str(tmp_path / f"{part}.de") for part in "ab")]
    args += ["--tgt", *(str(tmp_path / f"{part}.en") for part in "ab")]
    args += ["--out", *(str(tmp_path / f"{part}.align") for part in "ab")]
    script.main(args)
    links = (tmp_path / "a.align").read_text().splitlines() + (tmp_path / "b.align").read_text().splitlines()
    assert len(links) == 20
    for source, target, line in zip(src, tgt, links, strict=True):
        if not source:
            assert line == ""  # an empty side gets no links
            continue
        pairs = [tuple(map(int, link.split("-"))) for link in line.split()]
        assert pairs and all(i < len(source.split()) and j < len(target.split()) for i, j in pairs)
    assert links[0] == "0-0 1-1 2-2"  # the easy monotone pair
