"""A CTranslate2 decoding engine for a run: its export directory loaded, or its checkpoint
converted on the fly (`mtrain translate engine=ctranslate2`, `mtrain eval engine=ctranslate2`).

The engine itself (`mtrain.decode.ct2_engine`) only loads directories that `mtrain export`
wrote; converting a checkpoint is this package's job.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Optional

import torch

from mtrain.decode.ct2_engine import CTranslate2Model, is_export_dir, load_ctranslate2
from mtrain.export.ctranslate2_model import export_ctranslate2, run_metadata


def open_ctranslate2(run: Path, which: str, device: torch.device, precision: str = "auto",
                     num_threads: Optional[int] = None) -> CTranslate2Model:
    """A CTranslate2 model from an `mtrain export` directory, or from a run's checkpoint
    (`which`: best|last|a path) converted on the fly."""
    if is_export_dir(run):
        return load_ctranslate2(run, device, precision, num_threads)
    from mtrain.train.checkpoint import load_run

    return convert_loaded(load_run(run, which=which), device, precision, num_threads)


def convert_loaded(loaded, device: torch.device, precision: str = "auto",
                   num_threads: Optional[int] = None) -> CTranslate2Model:
    """A loaded run (`mtrain.train.checkpoint.LoadedRun`) converted in fp32 into a temporary
    directory and loaded from there (CTranslate2 quantizes on load when `precision` asks)."""
    with tempfile.TemporaryDirectory(prefix="mtrain-ct2-") as scratch:
        model_dir = export_ctranslate2(loaded.model.state_dict(), loaded.config.model, loaded.tokenizer,
                                       Path(scratch) / "model", metadata=run_metadata(loaded))
        # The weights are in memory once loaded; the run's tokenizer outlives the scratch copy.
        model = load_ctranslate2(model_dir, device, precision, num_threads, loaded.tokenizer)
    model.description = f"{loaded.checkpoint_path} (update {loaded.update}, converted), {model.translator.compute_type}"
    return model
