"""Checkpoints: written atomically, loaded safely, found by name in a run directory.

A checkpoint is a plain dict of tensors and Python scalars (model, optimizer, scheduler,
scaler and RNG states, data position, the plain-dict config), so it loads with
`torch.load(weights_only=True)`: no code from a checkpoint file is ever executed.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from mtrain.errors import MtrainError
from mtrain.rundir import RunDir, atomic_write

if TYPE_CHECKING:
    from mtrain.model import Seq2SeqTransformer

_OTHER_CHECKPOINT = (
    "use another checkpoint (translate/eval: checkpoint=last|best|update_N|PATH; to resume "
    "training from an older one: train.resume=true train.resume_from=update_N)"
)


def save_checkpoint(path: str | Path, state: dict[str, Any], then: str = "then resume with train.resume=true") -> None:
    """Write `state` to `path` atomically (`mtrain.rundir.atomic_write`): a crash at any
    moment leaves the old file intact. `then`: what to do after a failed write (training resumes)."""
    try:
        atomic_write(path, lambda handle: torch.save(state, handle))
    except OSError as error:
        raise MtrainError(
            f"{path}: could not write checkpoint ({error.strerror or error}); "
            f"the previous checkpoint is intact. Free disk space or fix permissions, {then}"
        ) from error


def load_checkpoint(path: str | Path, map_location: Any = "cpu", mmap: bool = False) -> dict[str, Any]:
    """Load a checkpoint with weights_only=True; a corrupt file is a clear MtrainError.

    `mmap=True` maps the tensors from the file instead of reading them (read-only uses: the
    tensors must not be updated in place): what is never read, such as the optimiser's moments
    when only the model is wanted, never takes memory. It holds 2/3 of a training checkpoint.
    """
    path = Path(path)
    if not path.is_file():
        raise MtrainError(f"{path}: checkpoint not found")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap and zipfile.is_zipfile(path))
        damaged = _damaged_record(path)
    except Exception as error:  # truncated zip, pickle error, foreign object types
        raise MtrainError(
            f"{path}: not a loadable mtrain checkpoint ({type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else 'no detail'}); "
            f"it may be truncated or corrupted: {_OTHER_CHECKPOINT}"
        ) from error
    if damaged is not None:
        raise MtrainError(
            f"{path}: corrupted checkpoint (record {damaged} fails its CRC-32 check); {_OTHER_CHECKPOINT}"
        )
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise MtrainError(f"{path}: not an mtrain checkpoint (no 'model' state dict)")
    return state


def _damaged_record(path: Path) -> str | None:
    """The first record of a checkpoint whose bytes fail the CRC-32 that torch.save wrote.

    torch.load does not check these sums, so a flipped bit inside a tensor would load as a
    silently different weight. Reading the file again costs well under a second per GB.
    """
    if not zipfile.is_zipfile(path):
        return None  # not torch's zip format: torch.load has judged it already
    with zipfile.ZipFile(path) as archive:
        return archive.testzip()


def stored_config(state: dict[str, Any], path: Path) -> DictConfig:
    """The FitConfig a checkpoint was trained with, its `model` section checked against this
    version's ModelConfig: an unknown key or a wrong type is an MtrainError naming the key;
    a key added after the checkpoint was written takes its default (the old behaviour)."""
    from mtrain.config import ModelConfig

    stored = state.get("config")
    if not isinstance(stored, dict) or not isinstance(stored.get("model"), dict):
        raise MtrainError(f"{path}: the checkpoint holds no model config; was it written by `mtrain fit`?")
    config = OmegaConf.create(stored)
    try:
        config.model = OmegaConf.merge(OmegaConf.structured(ModelConfig), stored["model"])
    except OmegaConfBaseException as error:
        key = getattr(error, "full_key", None) or "?"
        raise MtrainError(
            f"{path}: stored config key model.{key} does not fit this mtrain version "
            f"({str(error).splitlines()[0]}); was the checkpoint written by another mtrain version?"
        ) from error
    return config


def decode_weights(state: dict[str, Any], path: Path, weights: str = "auto") -> tuple[dict[str, Any], str]:
    """The state dict a checkpoint decodes with and its name ("ema" or "raw"): `weights=auto`
    takes the weights' average when the run kept one (train.ema_decay), `raw` the trained
    weights, `ema` the average or an MtrainError naming the checkpoint."""
    weights = str(getattr(weights, "value", weights))
    if weights == "raw" or (weights == "auto" and "ema" not in state):
        return state["model"], "raw"
    if "ema" not in state:
        raise MtrainError(
            f"{path}: weights=ema, but the checkpoint holds no average of the weights (its run "
            "trained without train.ema_decay); decode with weights=auto or weights=raw"
        )
    return state["ema"], "ema"


@dataclass
class LoadedRun:
    """A trained model ready to decode, with what is needed to use it."""

    model: Seq2SeqTransformer
    tokenizer: Any  # mtrain.tokenizer.Tokenizer
    config: DictConfig
    checkpoint_path: Path
    update: int
    weights: str = "raw"  # which of the checkpoint's weights `model` holds: raw (trained) or ema


def load_run(
    run_dir: str | Path,
    which: str = "best",
    device: str | torch.device = "cpu",
    checkpoint_path: Path | None = None,
    weights: str = "auto",
) -> LoadedRun:
    """Rebuild the model of a run from its checkpoint and tokenizer, in eval mode, with the
    checkpoint's `weights` (auto|ema|raw: `decode_weights`)."""
    from mtrain.model import build_model
    from mtrain.tokenizer import Tokenizer

    run = RunDir(run_dir)
    path = checkpoint_path or run.find_checkpoint(which)
    state = load_checkpoint(path, map_location="cpu", mmap=True)  # only the model is read
    config = stored_config(state, path)
    state_dict, chosen = decode_weights(state, path, weights)
    tokenizer_dir = run.tokenizer_dir
    if not tokenizer_dir.is_dir():
        raise MtrainError(f"run={run_dir}: no tokenizer/ directory; the run directory is incomplete")
    tokenizer = Tokenizer.load(tokenizer_dir)
    try:
        model = build_model(
            config.model,
            tokenizer.src_vocab_size,
            tokenizer.tgt_vocab_size,
            tokenizer.pad_id,
            joint_vocab=tokenizer.joint,
        )
    except MtrainError as error:
        raise MtrainError(f"{path}: the model config stored in the checkpoint is invalid: {error}") from error
    try:
        model.load_state_dict(state_dict)
    except (RuntimeError, TypeError, ValueError) as error:
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        raise MtrainError(
            f"{path}: checkpoint does not fit the model its config and {tokenizer_dir} describe "
            f"({lines[1] if len(lines) > 1 else lines[0] if lines else type(error).__name__}); "
            "was it written by an incompatible mtrain version, or was tokenizer/ replaced?"
        ) from error
    model.to(device).eval()
    return LoadedRun(model, tokenizer, config, path, int(state.get("update", 0)), chosen)
