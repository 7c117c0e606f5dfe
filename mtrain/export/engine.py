"""The decoding engine of a run: `open_engine`, the one place that opens one, for
`mtrain translate` and `mtrain eval` alike.

engine=torch: the run's checkpoint loaded into mtrain's model. engine=ctranslate2: an
`mtrain export` directory loaded, or the run's checkpoint converted on the fly. The
CTranslate2 engine itself (`mtrain.decode.ct2_engine`) only loads directories that
`mtrain export` wrote; converting a checkpoint is this package's job, which is why the
opener lives here, above decoding and below the commands.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import torch

from mtrain.config import Engine
from mtrain.errors import MtrainError
from mtrain.decode.ct2_engine import CTranslate2Model, is_export_dir, load_ctranslate2
from mtrain.runtime import resolve_decode_precision
from mtrain.export.ctranslate2_model import export_ctranslate2, run_metadata
from mtrain.train.checkpoint_files import LoadedRun, load_run


@dataclass
class RunEngine:
    """What decodes, as `mtrain.decode`'s functions take it (their `model`, `tokenizer`, `precision`)."""

    model: Any  # mtrain's nn.Module (engine=torch) or a CTranslate2Model
    tokenizer: Any  # mtrain.tokenizer.Tokenizer
    precision: str  # as decoding runs: fp32|bf16|fp16 (torch), CTranslate2's compute type (int8, float32, ...)
    description: str  # what decodes, for the log: the checkpoint, its update, the engine's weights
    loaded: Optional[LoadedRun]  # the checkpoint and the run's stored config; None for an export directory


def open_engine(run: Union[str, Path], engine: Engine, device: torch.device, precision: str = "auto",
                num_threads: Optional[int] = None, checkpoint: Union[str, Path] = "best",
                weights: str = "auto") -> RunEngine:
    """The engine that decodes with `run`'s `checkpoint` (best|last|a name|a path) and its
    `weights` (auto: the weights' average when the run kept one, else the trained ones; ema; raw).

    With engine=ctranslate2, `run` may also be a directory written by `mtrain export`.
    `precision`: mtrain's precision names (auto resolved for `device`); CTranslate2 also takes
    its compute types (int8, ...; mtrain.decode.ct2_engine).
    """
    if is_export_dir(Path(run)):
        if engine != Engine.ctranslate2:
            raise MtrainError(f"run={run}: is a CTranslate2 model written by `mtrain export`, not a run "
                              f"directory of `mtrain fit`; decode it with engine=ctranslate2")
        model = load_ctranslate2(Path(run), device, precision, num_threads)
        return RunEngine(model, model.tokenizer, model.translator.compute_type, model.description, None)
    # A checkpoint to convert is read on the CPU: CTranslate2 loads the converted copy on `device`.
    loaded = load_run(run, which=str(checkpoint), device=device if engine == Engine.torch else torch.device("cpu"),
                      weights=weights)
    if engine == Engine.ctranslate2:
        model = _converted(loaded, device, precision, num_threads)
        return RunEngine(model, loaded.tokenizer, model.translator.compute_type, model.description, loaded)
    resolved = resolve_decode_precision(precision, device)
    return RunEngine(loaded.model, loaded.tokenizer, resolved,
                     f"{loaded.checkpoint_path} (update {loaded.update}{_weights_note(loaded)}), {resolved}", loaded)


def _weights_note(loaded: LoadedRun) -> str:
    return ", EMA weights" if loaded.weights == "ema" else ""


def _converted(loaded: LoadedRun, device: torch.device, precision: str,
               num_threads: Optional[int]) -> CTranslate2Model:
    """A loaded run converted in fp32 into a temporary directory and loaded from there
    (CTranslate2 quantizes on load when `precision` asks)."""
    with tempfile.TemporaryDirectory(prefix="mtrain-ct2-") as scratch:
        model_dir = export_ctranslate2(loaded.model.state_dict(), loaded.config.model, loaded.tokenizer,
                                       Path(scratch) / "model", metadata=run_metadata(loaded))
        # The weights are in memory once loaded; the run's tokenizer outlives the scratch copy.
        model = load_ctranslate2(model_dir, device, precision, num_threads, loaded.tokenizer)
    model.description = (f"{loaded.checkpoint_path} (update {loaded.update}{_weights_note(loaded)}, converted), "
                         f"{model.translator.compute_type}")
    return model
