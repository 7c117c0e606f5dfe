"""Write a CTranslate2 model directory from a trained run.

    out/
      model.bin, config.json           the TransformerSpec (ctranslate2_spec.py), saved by ctranslate2
      shared_vocabulary.json           SentencePiece pieces in id order (or source_/target_vocabulary.json)
      spm.model                        the run's SentencePiece model(s) (or src.model + tgt.model)
      mtrain_export.json               where it came from, the special tokens, the position limit,
                                       the run's data config (its directions and language tags)

The directory is self-contained: `mtrain translate run=out engine=ctranslate2` reads it, and so
can any CTranslate2 user (`ctranslate2.Translator(out)` with the pieces of `spm.model`; the
source must end with the eos piece `</s>`, as mtrain's sources do, and a multilingual run's
start with the target language's tag piece, e.g. `<2fr>`).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mtrain.config import ModelConfig, to_plain
from mtrain.decode.ct2_engine import METADATA_FILE, import_ctranslate2
from mtrain.errors import MtrainError
from mtrain.export.ctranslate2_spec import build_spec, check_exportable
from mtrain.tokenizer import Tokenizer

if TYPE_CHECKING:
    from mtrain.train.checkpoint_files import LoadedRun

QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16", "float32")


def special_pieces(tokenizer: Tokenizer) -> dict[str, str]:
    """The pieces of unk/pad/bos/eos, as the (target) SentencePiece model names them."""
    ids = dataclasses.asdict(tokenizer.special_ids)
    return {name: tokenizer.tgt_pieces([i])[0] for name, i in ids.items()}


def vocabularies(tokenizer: Tokenizer) -> tuple[list[str], list[str]]:
    """Source and target pieces in id order (one list twice for a joint vocabulary)."""
    src = tokenizer.src_pieces(range(tokenizer.src_vocab_size))
    tgt = src if tokenizer.joint else tokenizer.tgt_pieces(range(tokenizer.tgt_vocab_size))
    for name, pieces in (("source", src), ("target", tgt)):
        if len(set(pieces)) != len(pieces):
            raise MtrainError(f"tokenizer: the {name} vocabulary has repeated pieces; CTranslate2 maps pieces to ids")
    return src, tgt


def export_ctranslate2(
    state: Mapping[str, Any],
    model_cfg: ModelConfig,
    tokenizer: Tokenizer,
    out_dir: Path,
    quantization: str | None = None,
    metadata: dict[str, Any] | None = None,
    force: bool = False,
) -> Path:
    """Convert a model (state_dict + its ModelConfig + tokenizer) into `out_dir`.

    The directory is written next to `out_dir` and renamed into place, so a failed export
    leaves no half-written model. With `force`, an existing `out_dir` is replaced.
    """
    import_ctranslate2()
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise MtrainError(f"quantization={quantization}: choose one of {'|'.join(QUANTIZATIONS)} (or null for fp32)")
    out_dir = Path(out_dir)
    check_export_target(out_dir, force)
    check_exportable(model_cfg)  # before any work
    src_vocabulary, tgt_vocabulary = vocabularies(tokenizer)
    pieces = special_pieces(tokenizer)
    spec = build_spec(state, model_cfg, src_vocabulary, tgt_vocabulary, pieces)
    spec.optimize(quantization=quantization)
    for path in tokenizer.files.values():
        spec.register_file(str(path), Path(path).name)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)  # left by a killed export
    staging.mkdir()
    try:
        spec.save(str(staging))
        record = {
            "format": "ctranslate2",
            "quantization": quantization or "float32",
            "max_positions": int(model_cfg.max_positions),
            "special_ids": dataclasses.asdict(tokenizer.special_ids),
            "special_pieces": pieces,
            "created": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            **(metadata or {}),
        }
        (staging / METADATA_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir


def check_export_target(out_dir: Path, force: bool, run_dir: Path | None = None) -> None:
    """Refuse, before any work, an `out_dir` the export may not write: with or without `force`,
    an existing one that is not a previous export (the run itself, a directory holding it or
    any other run or checkpoint, a file, a symbolic link); without `force`, a previous export
    (or an empty directory). `force` replaces an export and nothing else."""
    out_dir = Path(out_dir)
    if not (out_dir.exists() or out_dir.is_symlink()):
        return
    not_an_export = _not_an_export(out_dir, run_dir)
    if not_an_export is not None:
        raise MtrainError(
            f"out={out_dir}: {not_an_export}; an export replaces only a previous export (a directory "
            f"holding {METADATA_FILE}), whatever force says: choose another directory (nothing was written)"
        )
    if not force:
        raise MtrainError(f"out={out_dir}: already exists; choose another directory or pass force=true")


def _not_an_export(out_dir: Path, run_dir: Path | None) -> str | None:
    """Why the existing `out_dir` is no export that `force` may replace; None when it is one."""
    if out_dir.is_symlink():
        return "is a symbolic link"
    if not out_dir.is_dir():
        return "is a file"
    if run_dir is not None and Path(run_dir).is_dir():
        run, out = Path(run_dir).resolve(), out_dir.resolve()
        if out == run:
            return f"is run={run_dir} itself"
        if out in run.parents:
            return f"holds run={run_dir}"
    if not any(out_dir.iterdir()):
        return None  # nothing to lose
    if not (out_dir / METADATA_FILE).is_file():
        return "is not a directory `mtrain export` wrote"
    for directory, subdirectories, files in os.walk(out_dir):
        if "checkpoints" in subdirectories or any(name.endswith(".pt") for name in files):
            return f"holds a checkpoint or a run ({directory})"
    return None


def export_run(
    run_dir: Path,
    out_dir: Path,
    which: str = "best",
    quantization: str | None = None,
    force: bool = False,
    checkpoint_path: Path | None = None,
    weights: str = "auto",
) -> Path:
    """`mtrain export`: the run's checkpoint (`which`: best|last|a path) into `out_dir`, with its
    `weights` (auto: the weights' average when the run kept one)."""
    from mtrain.train.checkpoint_files import load_run

    check_export_target(out_dir, force, run_dir)  # before the checkpoint loads
    loaded = load_run(run_dir, which=which, checkpoint_path=checkpoint_path, weights=weights)
    check_exportable(loaded.config.model)
    return export_ctranslate2(
        loaded.model.state_dict(),
        loaded.config.model,
        loaded.tokenizer,
        out_dir,
        quantization,
        metadata=run_metadata(loaded),
        force=force,
    )


def run_metadata(loaded: LoadedRun) -> dict[str, Any]:
    """What `mtrain_export.json` says about the origin of the weights."""
    from mtrain import __version__

    return {
        "checkpoint": str(loaded.checkpoint_path.resolve()),
        "update": loaded.update,
        "weights": loaded.weights,  # raw (trained) or ema (train.ema_decay's average)
        "language_pair": f"{loaded.config.data.src}-{loaded.config.data.tgt}",
        # what it translates, and its tags (mtrain.decode.directions reads it back)
        "data": to_plain(loaded.config.data),
        "model": to_plain(loaded.config.model),
        "mtrain_version": __version__,
    }
