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
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mtrain.config import ModelConfig, to_plain
from mtrain.decode.engines.ct2_engine import import_ctranslate2
from mtrain.errors import MtrainError
from mtrain.export.ctranslate2_spec import build_spec, check_exportable
from mtrain.export.portable import RELATIVE_TO_EXPORT, portable, relative_paths, relative_to
from mtrain.export.target import check_export_target, write_record
from mtrain.rundir import staged
from mtrain.tokenizer import Tokenizer

if TYPE_CHECKING:
    from mtrain.checkpoint.files import LoadedRun

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
    leaves no half-written model. With `force`, an existing `out_dir` is replaced when it is an
    export (mtrain.export.target); anything else there is refused before any work.
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

    with staged(out_dir) as staging:
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
        write_record(staging, record)
    return out_dir


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
    from mtrain.checkpoint.files import load_run

    check_export_target(out_dir, force, run_dir)  # before the checkpoint loads
    loaded = load_run(run_dir, which=which, checkpoint_path=checkpoint_path, weights=weights)
    check_exportable(loaded.config.model)
    return export_ctranslate2(
        loaded.model.state_dict(),
        loaded.config.model,
        loaded.tokenizer,
        out_dir,
        quantization,
        metadata=run_metadata(loaded, Path(out_dir)),
        force=force,
    )


def run_metadata(loaded: LoadedRun, out_dir: Path | None = None) -> dict[str, Any]:
    """What `mtrain_export.json` says about the origin of the weights. Written into the export
    directory `out_dir`, its paths (the checkpoint, the data's directories) are relative to it
    (mtrain.export.portable): no path of this machine, and `mtrain eval run=EXPORT` still finds
    the run's split; without `out_dir` (a conversion to a scratch directory), as they are."""
    from mtrain import __version__

    checkpoint = str(loaded.checkpoint_path.resolve())
    data = to_plain(loaded.config.data)
    if out_dir is not None:
        checkpoint, data = relative_to(checkpoint, out_dir), relative_paths(data, out_dir)
    record = {
        "checkpoint": checkpoint,
        "update": loaded.update,
        "weights": loaded.weights,  # raw (trained) or ema (train.ema_decay's average)
        "language_pair": f"{loaded.config.data.src}-{loaded.config.data.tgt}",
        # what it translates, and its tags (mtrain.decode.engines.directions reads it back)
        "data": data,
        "model": to_plain(loaded.config.model),
        "mtrain_version": __version__,
    }
    return portable({**record, "paths": RELATIVE_TO_EXPORT}) if out_dir is not None else record
