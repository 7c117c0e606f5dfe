"""Checkpoint averaging: the mean of the parameters of several checkpoints of one run.

The semantics are fairseq's `average_checkpoints`: every entry of the model's state dict is
summed over the checkpoints and divided by their number (integer buffers are floor-divided),
and the result is written as a new checkpoint. Averaging the last few checkpoints of a run
usually gains a little BLEU for free. Floating-point entries are accumulated in float64 and
stored back in their own dtype, so a bf16/fp16 model averages as precisely as it can.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Sequence, Union

import torch

from mtrain.errors import MtrainError
from mtrain.rundir import RunDir
from mtrain.train.checkpoint import load_checkpoint, save_checkpoint

# Training state that belongs to one point of the optimisation, not to an average of them.
_TRAINING_STATE = ("optimizer", "scheduler", "scaler", "rng")


def last_checkpoints(run_dir: Union[str, Path], count: int) -> List[Path]:
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


def average_checkpoints(paths: Sequence[Union[str, Path]]) -> Dict[str, Any]:
    """A checkpoint whose `model` is the mean of the given checkpoints' models.

    The other entries (config, update, ...) come from the last checkpoint of the list;
    optimizer, scheduler, scaler and RNG states are dropped, since they describe one point
    of training, and `averaged_from` lists the sources.
    """
    paths = [Path(p) for p in paths]
    if not paths:
        raise MtrainError("average: no checkpoints given")
    sums: Dict[str, torch.Tensor] = {}
    dtypes: Dict[str, torch.dtype] = {}
    first_keys: List[str] = []
    state: Dict[str, Any] = {}
    for index, path in enumerate(paths):
        state = load_checkpoint(path, map_location="cpu", mmap=True)  # optimiser states never read
        model = state["model"]
        if index == 0:
            first_keys = list(model)
        elif set(model) != set(first_keys):
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
            dtypes.setdefault(key, tensor.dtype)
            # integer buffers (a uint8 output-vocabulary mask) sum in int64: no overflow
            value = tensor.double() if tensor.is_floating_point() else tensor.long()
            sums[key] = value if index == 0 else sums[key] + value

    averaged: Dict[str, torch.Tensor] = {}
    for key in first_keys:
        total = sums[key]
        mean = total / len(paths) if total.is_floating_point() else total // len(paths)
        averaged[key] = mean.to(dtypes[key])

    result = {key: value for key, value in state.items() if key not in _TRAINING_STATE}
    result["model"] = averaged
    result["averaged_from"] = [str(path) for path in paths]
    return result


def average_to_file(paths: Sequence[Union[str, Path]], out: Union[str, Path]) -> Path:
    """Average `paths` and write the result atomically to `out`."""
    out = Path(out)
    if any(out.resolve() == Path(path).resolve() for path in paths):
        raise MtrainError(f"out={out}: is one of the checkpoints being averaged; choose another file")
    save_checkpoint(out, average_checkpoints(paths))
    return out


def default_average_path(run_dir: Union[str, Path], count: int) -> Path:
    return RunDir(run_dir).checkpoint(f"average_last{count}")
