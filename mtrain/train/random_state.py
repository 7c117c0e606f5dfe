"""Random state: seeding, and every generator's state as plain values for a checkpoint.

(Device, precision and threads are the shared core's: `mtrain.runtime`.)
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """All random generators' states, as tensors and plain values (weights_only-safe)."""
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": _numpy_state_to_plain(np.random.get_state(legacy=True)),
        "python": _python_state_to_plain(random.getstate()),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(_plain_to_numpy_state(state["numpy"]))
    random.setstate(_plain_to_python_state(state["python"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _numpy_state_to_plain(state: dict[str, Any] | tuple[str, np.ndarray, int, int, float]) -> dict[str, Any]:
    assert isinstance(state, tuple)  # the global generator is an MT19937: legacy=True gives its 5-tuple
    name, keys, pos, has_gauss, cached = state
    return {
        "name": name,
        "keys": torch.from_numpy(keys.astype(np.int64)),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached": float(cached),
    }


def _plain_to_numpy_state(plain: dict[str, Any]) -> tuple[str, np.ndarray, int, int, float]:
    keys = plain["keys"].numpy().astype(np.uint32)
    return (plain["name"], keys, plain["pos"], plain["has_gauss"], plain["cached"])


def _python_state_to_plain(state: tuple[Any, ...]) -> dict[str, Any]:
    version, internal, gauss = state
    return {"version": version, "internal": torch.tensor(internal, dtype=torch.int64), "gauss": gauss}


def _plain_to_python_state(plain: dict[str, Any]) -> tuple[Any, ...]:
    return (plain["version"], tuple(int(x) for x in plain["internal"].tolist()), plain["gauss"])
