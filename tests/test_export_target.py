"""`mtrain export` never writes over what it did not write, in every format, and what it writes
holds no path of the exporting machine (issue 49): through the real command, with a hash of
every file of the run and of the user's files before and after."""

from __future__ import annotations

import hashlib
import json
import os
import random
import tempfile
import zipfile
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed (pip install 'mtrain[ct2]')")
pytest.importorskip("transformers", reason="transformers is not installed (pip install 'mtrain[hf]')")

from mtrain.config import FitConfig, ModelConfig, to_plain
from mtrain.model import build_model
from tests.warm_process import run_mtrain

FORMATS = ("ctranslate2", "hf", "argos")
MODEL = dict(encoder_layers=1, decoder_layers=1, d_model=32, heads=2, ffn_dim=64, dropout=0.0, max_positions=64)
WORDS = [
    "ein",
    "mann",
    "eine",
    "frau",
    "kind",
    "hund",
    "katze",
    "ball",
    "park",
    "two",
    "men",
    "a",
    "woman",
    "child",
    "dog",
    "cat",
    "plays",
    "runs",
]
REFUSAL = (
    "; an export replaces only a previous export (a directory holding mtrain_export.json, or an Argos package "
    "mtrain wrote), whatever force says: choose another out (nothing was written)"
)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A run directory with every kind of file `mtrain fit` leaves (an untrained tiny model), whose
    config and overrides name absolute paths (the corpus, the cache, the run)."""
    from mtrain.checkpoint.files import save_checkpoint
    from mtrain.tokenizer import train_or_load_tokenizer

    base = tmp_path_factory.mktemp("exporting")
    corpus, run = base / "corpus", base / "run"
    corpus.mkdir()
    rng = random.Random(3)
    for split, count in (("train", 200), ("val", 4), ("test", 6)):
        lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6))) for _ in range(count)]
        for lang in ("de", "en"):
            (corpus / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    cfg = OmegaConf.structured(FitConfig(model=ModelConfig(**MODEL)))
    cfg.data.local_dir, cfg.data.cache_dir, cfg.data.splits.test = str(corpus), str(base / "cache"), "test"
    cfg.tokenizer.vocab_size = 40
    tokenizer = train_or_load_tokenizer(cfg.tokenizer, cfg.data, log=lambda *_: None)
    torch.manual_seed(0)
    vocab = tokenizer.src_vocab_size, tokenizer.tgt_vocab_size
    model = build_model(ModelConfig(**MODEL), *vocab, tokenizer.pad_id, joint_vocab=tokenizer.joint)
    tokenizer.save(run / "tokenizer")
    (run / "config.yaml").write_text(OmegaConf.to_yaml(cfg), encoding="utf-8")
    for name in ("best", "last"):
        state = {"model": model.state_dict(), "config": to_plain(cfg), "update": 7}
        save_checkpoint(run / "checkpoints" / f"{name}.pt", state)
    (run / ".hydra").mkdir()
    overrides = [f"data.local_dir={corpus}", f"data.cache_dir={base / 'cache'}", f"hydra.run.dir={run}"]
    (run / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides), encoding="utf-8")
    (run / "data").mkdir()
    for suffix, lang in (("src", "de"), ("ref", "en")):
        (run / "data" / f"test.{suffix}").write_bytes((corpus / f"test.{lang}").read_bytes())
    (run / "eval").mkdir()
    report = {"split": "test", "split_name": "test", "language_pair": "de-en", "sentences": 6,
              "checkpoint": {"which": "best", "update": 7, "path": str(run / "checkpoints" / "best.pt")},
              "decode": {"beam": 5, "length_penalty": 1.0},
              "metrics": {"bleu": {"name": "BLEU", "score": 1.5, "signature": "nrefs:1|case:mixed|tok:13a"}}}  # fmt: skip
    (run / "eval" / "test.json").write_text(json.dumps(report), encoding="utf-8")
    (run / "metrics.json").write_text(json.dumps({"updates": 7, "stop_reason": f"done in {run}"}), encoding="utf-8")
    (run / "train.log").write_text(f"run {run}\n", encoding="utf-8")
    return run


def snapshot(*roots: Path) -> dict[str, str]:
    """{path: sha256} of every file under (or at) `roots`."""
    files = [p for root in roots for p in ([root] if root.is_file() else sorted(root.rglob("*"))) if p.is_file()]
    return {str(path): hashlib.sha256(path.read_bytes()).hexdigest() for path in files}


def export(run: Path, fmt: str, out: Path, force: bool = True):
    return run_mtrain(
        "export", f"run={run}", f"format={fmt}", f"out={out}", f"force={str(force).lower()}", text=True, timeout=300
    )


def error_line(result) -> str:
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    (line,) = result.stderr.strip().splitlines()
    return line


def user_folder(path: Path) -> Path:
    (path / "sub").mkdir(parents=True)
    (path / "notes.txt").write_text("mine\n", encoding="utf-8")
    (path / "sub" / "data.bin").write_bytes(bytes(range(256)))
    return path


@pytest.mark.parametrize("fmt", FORMATS)
def test_force_never_writes_over_what_export_did_not_write(fmt, run_dir, tmp_path):
    """The run itself, a directory holding it, a folder inside it, a user's folder or file, a link:
    each refused in one line naming out= and why, and not one byte of the run or the user's
    files changes (the run's files checked by hash before and after)."""
    name = "x.argosmodel" if fmt == "argos" else "x"
    folder = user_folder(tmp_path / "folder" / name)
    mine = tmp_path / "file" / name
    mine.parent.mkdir()
    mine.write_bytes(b"PK\x03\x04 a user's file\n")
    (tmp_path / "link").mkdir()
    (tmp_path / "link" / name).symlink_to(run_dir, target_is_directory=True)
    cases = [
        (folder, "is not a directory `mtrain export` wrote"),
        (mine, "is not an Argos package `mtrain export` wrote" if fmt == "argos" else "is a file"),
    ]
    if fmt == "argos":  # an Argos package is named *.argosmodel, which the run is not
        cases.append((tmp_path / "link" / name, "is a symbolic link"))
    else:
        cases.append((run_dir, f"is run={run_dir} itself"))
    if fmt == "ctranslate2":  # the same rule for every format: these once
        cases += [
            (run_dir.parent, f"holds run={run_dir}"),
            (run_dir / "checkpoints", "is not a directory `mtrain export` wrote"),
        ]
    before = snapshot(run_dir, tmp_path)
    for out, reason in cases:
        result = export(run_dir, fmt, out)
        assert error_line(result) == f"mtrain: error: out={out}: {reason}{REFUSAL}"
    assert snapshot(run_dir, tmp_path) == before
    assert sorted(p.name for p in tmp_path.rglob(".*")) == []  # no staging left behind


def test_force_replaces_an_export_of_any_format_and_no_export_names_this_machine(run_dir, tmp_path):
    """One `out` exported over in turn: a directory over a directory, a package over a directory,
    over a package, a directory over a package; the run and the user's files beside `out` stay
    byte-identical; an export holding a file it did not write is refused; no exported file holds
    the run's path, the temporary or the home folder, and the CTranslate2 record finds the run by
    paths relative to the export (`mtrain eval run=EXPORT` reads them: tests/test_export.py)."""
    out = tmp_path / "exports" / "m.argosmodel"  # a name every format may write
    neighbour = user_folder(tmp_path / "exports" / "mine")
    before = snapshot(run_dir, neighbour)
    forbidden = [str(run_dir.resolve()), tempfile.gettempdir().rstrip("/") + "/", str(Path.home()) + "/"]
    previous = None
    for fmt in ("ctranslate2", "hf", "argos", "argos", "ctranslate2"):
        result = export(run_dir, fmt, out, force=previous is not None)
        assert result.returncode == 0, result.stderr[-3000:]
        assert out.is_file() == (fmt == "argos"), f"{fmt} over {previous}"
        if fmt == "argos":
            assert "score: BLEU " in result.stdout
            assert "the run's own decoding (beam 5, length penalty 1.0): BLEU 1.50" in result.stdout
        for name, data in exported_files(out).items():
            for text in forbidden:
                assert text.encode() not in data, f"{fmt}: {name} holds {text}"
        assert sorted(p.name for p in out.parent.iterdir()) == ["m.argosmodel", "mine"]  # no staging left
        previous = fmt
    assert snapshot(run_dir, neighbour) == before

    record = json.loads((out / "mtrain_export.json").read_text(encoding="utf-8"))
    assert Path(os.path.normpath(out / record["checkpoint"])) == run_dir / "checkpoints" / "best.pt"
    assert Path(os.path.normpath(out / record["data"]["local_dir"])) == run_dir.parent / "corpus"
    assert "mtrain_export.json" not in record["files"] and "model.bin" in record["files"]

    (out / "notes.txt").write_text("added by hand\n", encoding="utf-8")
    for fmt in FORMATS:
        result = export(run_dir, fmt, out)
        reason = "holds notes.txt, which `mtrain export` did not write"
        assert error_line(result) == f"mtrain: error: out={out}: {reason}{REFUSAL}"
    assert (out / "notes.txt").is_file()


def exported_files(out: Path) -> dict[str, bytes]:
    """Every file an export wrote: a directory's, or an Argos package's members."""
    if out.is_file():
        with zipfile.ZipFile(out) as archive:
            return {name: archive.read(name) for name in archive.namelist() if not name.endswith("/")}
    return {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
