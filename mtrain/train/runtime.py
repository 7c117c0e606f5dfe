"""Device, precision, threads and random state: what a run needs from the machine."""

from __future__ import annotations

import contextlib
import random
from typing import Any, Dict, Optional

import numpy as np
import torch

from mtrain.errors import MtrainError

PRECISIONS = ("auto", "fp32", "bf16", "fp16")


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """'auto' -> the local rank's GPU if CUDA is usable, else the CPU."""
    if name == "auto":
        return torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise MtrainError(f"device={name!r}: not a device name (auto, cpu, cuda, cuda:N)") from error
    if device.type == "cuda" and not torch.cuda.is_available():
        raise MtrainError(f"device={name}: CUDA is not available on this machine; use device=cpu or auto")
    return device


def cpu_has_bf16_matmul() -> bool:
    """True on CPUs with bf16 matrix instructions (AVX512-BF16 or AMX), where bf16 pays off."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def resolve_precision(name: str, device: torch.device) -> str:
    """'auto' -> bf16 where the hardware runs it fast, else fp32.

    On this project's CPUs bf16 autocast trains ~2x faster per minute than fp32 at the
    same BLEU per update (scripts/bench_train.py; figures in docs/PERFORMANCE.md).
    """
    if name not in PRECISIONS:
        raise MtrainError(f"precision={name!r}: choose one of {'|'.join(PRECISIONS)}")
    if name == "fp16" and device.type != "cuda":
        raise MtrainError("precision=fp16 needs a CUDA device; use bf16 or fp32 on CPU")
    if name != "auto":
        return name
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "bf16" if cpu_has_bf16_matmul() else "fp32"


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """The autocast context for a precision (a no-op for fp32)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def set_threads(num_threads: Optional[int]) -> None:
    if num_threads:
        torch.set_num_threads(num_threads)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> Dict[str, Any]:
    """All random generators' states, as tensors and plain values (weights_only-safe)."""
    state: Dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": _numpy_state_to_plain(np.random.get_state()),
        "python": _python_state_to_plain(random.getstate()),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(_plain_to_numpy_state(state["numpy"]))
    random.setstate(_plain_to_python_state(state["python"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _numpy_state_to_plain(state: tuple) -> Dict[str, Any]:
    name, keys, pos, has_gauss, cached = state
    return {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
            "has_gauss": int(has_gauss), "cached": float(cached)}


def _plain_to_numpy_state(plain: Dict[str, Any]) -> tuple:
    keys = plain["keys"].numpy().astype(np.uint32)
    return (plain["name"], keys, plain["pos"], plain["has_gauss"], plain["cached"])


def _python_state_to_plain(state: tuple) -> Dict[str, Any]:
    version, internal, gauss = state
    return {"version": version, "internal": torch.tensor(internal, dtype=torch.int64), "gauss": gauss}


def _plain_to_python_state(plain: Dict[str, Any]) -> tuple:
    return (plain["version"], tuple(int(x) for x in plain["internal"].tolist()), plain["gauss"])
