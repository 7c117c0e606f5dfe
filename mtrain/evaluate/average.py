"""Checkpoint averaging: the mean of the parameters of several checkpoints of one run.

The semantics are fairseq's `average_checkpoints`: every entry of the model's state dict is
summed over the checkpoints and divided by their number (integer buffers are floor-divided),
and the result is written as a new checkpoint. Averaging the last few checkpoints of a run
usually gains a little BLEU for free. Floating-point entries are accumulated in float64 and
stored back in their own dtype, so a bf16/fp16 model averages as precisely as it can.

Only checkpoints of one run make a useful average, and same-shaped checkpoints of other runs
would average silently. So each checkpoint's record of its run is compared with the first's:
another tokenizer (its fingerprint in `data_fingerprints`) is refused, since the same token id
names other pieces in the two; another seed, training corpus or model config is a warning that
names both runs. Training settings (`train.*`) are not compared: a resumed run may change them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from mtrain.checkpoint.files import load_checkpoint, save_checkpoint
from mtrain.errors import MtrainError
from mtrain.rundir import RunDir, training_checkpoint_of

# Training state that belongs to one point of the optimisation, not to an average of them.
_TRAINING_STATE = ("optimizer", "scheduler", "scaler", "rng")

log = logging.getLogger("mtrain")


def last_checkpoints(run_dir: str | Path, count: int) -> list[Path]:
    """The newest `count` `update_<N>.pt` checkpoints of a run, oldest first."""
    run = RunDir(run_dir)
    if count < 1:
        raise MtrainError(f"average_last={count}: must be at least 1")
    if not run.path.is_dir():
        raise MtrainError(f"run={run_dir}: no such run directory")
    found = run.update_checkpoints()
    if not found:
        raise MtrainError(
            f"run={run_dir}: no update_<N>.pt checkpoints in {run.checkpoint_dir} to average; "
            "is this a run directory written by `mtrain fit`?"
        )
    if len(found) < count:
        raise MtrainError(
            f"run={run_dir}: {count} checkpoints asked for but only {len(found)} update_<N>.pt kept "
            f"({', '.join(p.name for p in found)}); average fewer, or train with train.keep_last>={count}"
        )
    return found[-count:]


def average_checkpoints(paths: Sequence[str | Path]) -> dict[str, Any]:
    """A checkpoint whose `model` is the mean of the given checkpoints' models.

    The other entries (config, update, ...) come from the last checkpoint of the list;
    optimizer, scheduler, scaler and RNG states are dropped, since they describe one point
    of training, and `averaged_from` lists the sources. Checkpoints of a run with
    train.ema_decay also hold the weights' moving average (`ema`): when every one does, the
    averages are averaged too, so the result decodes as they do (`weights=raw` the mean of
    the trained weights).
    """
    files = [Path(p) for p in paths]
    if not files:
        raise MtrainError("average: no checkpoints given")
    states = [load_checkpoint(path, map_location="cpu", mmap=True) for path in files]  # optimiser states never read
    for state, path in zip(states[1:], files[1:], strict=True):
        _check_same_run(states[0], files[0], state, path)
    result = {key: value for key, value in states[-1].items() if key not in _TRAINING_STATE}
    result["model"] = _mean_of([state["model"] for state in states], files)
    if all("ema" in state for state in states):
        result["ema"] = _mean_of([state["ema"] for state in states], files)
    else:
        for key in ("ema", "ema_decay", "decode_weights"):
            result.pop(key, None)
    result["averaged_from"] = [str(path) for path in files]
    return result


def _mean_of(state_dicts: list[dict[str, torch.Tensor]], paths: list[Path]) -> dict[str, torch.Tensor]:
    """The entry-wise mean of same-shaped state dicts (floats in float64, integers floor-divided)."""
    first_keys = list(state_dicts[0])
    sums: dict[str, torch.Tensor] = {}
    for index, (model, path) in enumerate(zip(state_dicts, paths, strict=True)):
        if index > 0 and set(model) != set(first_keys):
            difference = sorted(set(model) ^ set(first_keys))
            raise MtrainError(
                f"{path}: its parameters differ from {paths[0]}'s ({', '.join(difference[:5])}"
                f"{' ...' if len(difference) > 5 else ''}); only checkpoints of one model can be averaged"
            )
        for key, tensor in model.items():
            if index > 0 and tensor.shape != sums[key].shape:
                raise MtrainError(
                    f"{path}: {key} has shape {tuple(tensor.shape)}, {paths[0]} has {tuple(sums[key].shape)}"
                )
            # integer buffers (a uint8 output-vocabulary mask) sum in int64: no overflow
            value = tensor.double() if tensor.is_floating_point() else tensor.long()
            sums[key] = value if index == 0 else sums[key] + value
    averaged: dict[str, torch.Tensor] = {}
    for key in first_keys:
        total = sums[key]
        mean = total / len(paths) if total.is_floating_point() else total // len(paths)
        averaged[key] = mean.to(state_dicts[0][key].dtype)
    return averaged


def _check_same_run(first: dict[str, Any], first_path: Path, other: dict[str, Any], other_path: Path) -> None:
    """Refuse `other` if its tokenizer is not `first`'s; warn if it comes from another run.
    Checkpoints written before mtrain stored these records are not compared."""
    first_data, other_data = first.get("data_fingerprints") or {}, other.get("data_fingerprints") or {}
    first_tokenizer, other_tokenizer = first_data.get("tokenizer"), other_data.get("tokenizer")
    if first_tokenizer and other_tokenizer and first_tokenizer != other_tokenizer:
        raise MtrainError(
            f"{other_path}: its tokenizer differs from {first_path}'s (fingerprint {other_tokenizer[:12]} vs "
            f"{first_tokenizer[:12]}): the same token ids mean other pieces, so the average is meaningless; "
            "average checkpoints of one run"
        )
    first_config, other_config = first.get("config") or {}, other.get("config") or {}
    differences = []
    if first_config.get("seed") != other_config.get("seed"):
        differences.append(f"seed {first_config.get('seed')} vs {other_config.get('seed')}")
    if first_data.get("corpus") != other_data.get("corpus"):
        differences.append(
            f"training data (corpus fingerprint {str(first_data.get('corpus'))[:12]} vs "
            f"{str(other_data.get('corpus'))[:12]})"
        )
    first_model, other_model = first_config.get("model") or {}, other_config.get("model") or {}
    changed = sorted(key for key in set(first_model) | set(other_model) if first_model.get(key) != other_model.get(key))
    if changed:
        differences.append(
            "model config ("
            + ", ".join(f"model.{key}={first_model.get(key)!r} vs {other_model.get(key)!r}" for key in changed[:3])
            + (" ..." if len(changed) > 3 else "")
            + ")"
        )
    if differences:
        log.warning(
            "average: %s and %s come from different runs (%s); an average of separately trained models is "
            "rarely a working model: average the checkpoints of one run",
            _run_of(first_path),
            _run_of(other_path),
            "; ".join(differences),
        )


def _run_of(path: Path) -> str:
    """How a checkpoint's run is named: its run directory when it lies in `<run>/checkpoints/`."""
    if path.parent.name == "checkpoints":
        return f"{path.name} of run {path.parent.parent}"
    return str(path)


def average_to_file(paths: Sequence[str | Path], out: str | Path) -> Path:
    """Average `paths` and write the result atomically to `out`."""
    out = Path(out)
    if any(out.resolve() == Path(path).resolve() for path in paths):
        raise MtrainError(f"out={out}: is one of the checkpoints being averaged; choose another file")
    run = training_checkpoint_of(out)
    if run is not None:  # (the command refuses it before any work: mtrain.config_checks)
        raise MtrainError(
            f"out={out}: is {out.resolve().name} of the run {run.path}, which training writes; choose another file"
        )
    # Nothing to resume here: the advice is where else the average can go.
    save_checkpoint(
        out,
        average_checkpoints(paths),
        then="or write the average elsewhere (mtrain average: out=FILE; mtrain eval: out=DIR)",
    )
    return out


def default_average_path(run_dir: str | Path, count: int, out_dir: str | Path | None = None) -> Path:
    """`<run>/checkpoints/average_last<count>.pt`, or that file name in `out_dir`."""
    path = RunDir(run_dir).checkpoint(f"average_last{count}")
    return Path(out_dir) / path.name if out_dir is not None else path
