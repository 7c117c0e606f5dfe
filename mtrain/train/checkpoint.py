"""Checkpoints: written atomically, loaded safely, found by name in a run directory.

A checkpoint is a plain dict of tensors and Python scalars (model, optimizer, scheduler,
scaler and RNG states, data position, the plain-dict config), so it loads with
`torch.load(weights_only=True)`: no code from a checkpoint file is ever executed.
"""

from __future__ import annotations

import os
import re
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

import torch
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from mtrain.errors import MtrainError

CHECKPOINT_DIR = "checkpoints"
_UPDATE_NAME = re.compile(r"^update_(\d+)\.pt$")
_OTHER_CHECKPOINT = ("use another checkpoint (translate/eval: checkpoint=last|best|PATH; to resume training, "
                     "copy an older checkpoints/update_N.pt over checkpoints/last.pt)")


def save_checkpoint(path: Union[str, Path], state: Dict[str, Any]) -> None:
    """Write `state` to `path` so that a crash at any moment leaves the old file intact.

    The bytes go to a temporary file in the same directory, are fsynced, and only then
    renamed over `path` (rename is atomic on POSIX file systems).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as tmp_file:
            torch.save(state, tmp_file)
            tmp_file.flush()
            os.fsync(tmp_file.fileno())
        os.replace(tmp_name, path)
        _fsync_directory(path.parent)
    except BaseException as error:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        if isinstance(error, OSError):
            raise MtrainError(
                f"{path}: could not write checkpoint ({error.strerror or error}); "
                "the previous checkpoint is intact. Free disk space or fix permissions, "
                "then resume with train.resume=true"
            ) from error
        raise


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def load_checkpoint(path: Union[str, Path], map_location: Any = "cpu") -> Dict[str, Any]:
    """Load a checkpoint with weights_only=True; a corrupt file is a clear MtrainError."""
    path = Path(path)
    if not path.is_file():
        raise MtrainError(f"{path}: checkpoint not found")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
        damaged = _damaged_record(path)
    except Exception as error:  # truncated zip, pickle error, foreign object types
        raise MtrainError(
            f"{path}: not a loadable mtrain checkpoint ({type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else 'no detail'}); "
            f"it may be truncated or corrupted: {_OTHER_CHECKPOINT}"
        ) from error
    if damaged is not None:
        raise MtrainError(
            f"{path}: corrupted checkpoint (record {damaged} fails its CRC-32 check); "
            f"{_OTHER_CHECKPOINT}"
        )
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise MtrainError(f"{path}: not an mtrain checkpoint (no 'model' state dict)")
    return state


def _damaged_record(path: Path) -> Optional[str]:
    """The first record of a checkpoint whose bytes fail the CRC-32 that torch.save wrote.

    torch.load does not check these sums, so a flipped bit inside a tensor would load as a
    silently different weight. Reading the file again costs well under a second per GB.
    """
    if not zipfile.is_zipfile(path):
        return None  # not torch's zip format: torch.load has judged it already
    with zipfile.ZipFile(path) as archive:
        return archive.testzip()


def update_checkpoints(run_dir: Union[str, Path]) -> List[Path]:
    """The `update_<N>.pt` checkpoints of a run, oldest first."""
    directory = Path(run_dir) / CHECKPOINT_DIR
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _UPDATE_NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def find_checkpoint(run_dir: Union[str, Path], which: str = "best") -> Path:
    """Resolve `best`, `last` or an explicit path to an existing checkpoint file."""
    run_dir = Path(run_dir)
    if which not in ("best", "last"):
        path = Path(which)
        if not path.is_absolute() and not path.exists():
            path = run_dir / CHECKPOINT_DIR / which
        if not path.is_file():
            raise MtrainError(f"checkpoint={which}: no such file (looked in . and {run_dir / CHECKPOINT_DIR})")
        return path
    if not run_dir.is_dir():
        raise MtrainError(f"run={run_dir}: no such run directory")
    path = run_dir / CHECKPOINT_DIR / f"{which}.pt"
    if path.is_file():
        return path
    fallback = run_dir / CHECKPOINT_DIR / "last.pt"
    if which == "best" and fallback.is_file():
        return fallback
    raise MtrainError(
        f"run={run_dir}: no checkpoints in {run_dir / CHECKPOINT_DIR}; "
        "is this a run directory written by `mtrain fit`?"
    )


def stored_config(state: Dict[str, Any], path: Path) -> DictConfig:
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


@dataclass
class LoadedRun:
    """A trained model ready to decode, with what is needed to use it."""

    model: torch.nn.Module
    tokenizer: Any  # mtrain.tokenizer.Tokenizer
    config: DictConfig
    checkpoint_path: Path
    update: int


def load_run(
    run_dir: Union[str, Path],
    which: str = "best",
    device: Union[str, torch.device] = "cpu",
    checkpoint_path: Optional[Path] = None,
) -> LoadedRun:
    """Rebuild the model of a run from its checkpoint and tokenizer, in eval mode."""
    from mtrain.model import build_model
    from mtrain.tokenizer import Tokenizer

    run_dir = Path(run_dir)
    path = checkpoint_path or find_checkpoint(run_dir, which)
    state = load_checkpoint(path, map_location="cpu")
    config = stored_config(state, path)
    tokenizer_dir = run_dir / "tokenizer"
    if not tokenizer_dir.is_dir():
        raise MtrainError(f"run={run_dir}: no tokenizer/ directory; the run directory is incomplete")
    tokenizer = Tokenizer.load(tokenizer_dir)
    try:
        model = build_model(config.model, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, tokenizer.pad_id,
                            joint_vocab=tokenizer.joint)
    except MtrainError as error:
        raise MtrainError(f"{path}: the model config stored in the checkpoint is invalid: {error}") from error
    try:
        model.load_state_dict(state["model"])
    except (RuntimeError, TypeError, ValueError) as error:
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        raise MtrainError(
            f"{path}: checkpoint does not fit the model its config and {tokenizer_dir} describe "
            f"({lines[1] if len(lines) > 1 else lines[0] if lines else type(error).__name__}); "
            "was it written by an incompatible mtrain version, or was tokenizer/ replaced?"
        ) from error
    model.to(device).eval()
    return LoadedRun(model, tokenizer, config, path, int(state.get("update", 0)))
