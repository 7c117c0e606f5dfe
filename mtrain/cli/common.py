"""What every Hydra app of mtrain shares: the config directory and error handling."""

from __future__ import annotations

import functools
import logging
import sys
from pathlib import Path
from typing import Any, Callable

from mtrain.config import register_configs
from mtrain.errors import MtrainError

# configs/ sits at the repository root, next to the package (installed with `pip install -e .`).
CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "configs")

register_configs()

log = logging.getLogger("mtrain")


def user_errors_as_messages(app: Callable[..., Any]) -> Callable[..., Any]:
    """Turn an MtrainError raised by `app` into one line on stderr and exit status 2.

    In a multirun sweep the failing job is reported and the sweep goes on: one diverged
    ablation must not cancel the others.
    """

    @functools.wraps(app)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return app(*args, **kwargs)
        except MtrainError as error:
            print(f"mtrain: error: {error}", file=sys.stderr)
            if _in_multirun():
                log.error("job failed: %s", error)
                return None
            sys.exit(2)

    return wrapper


def _in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
