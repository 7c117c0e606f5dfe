"""What every Hydra app of mtrain shares: the config directory and error handling."""

from __future__ import annotations

import dataclasses
import functools
import logging
import sys
from pathlib import Path
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf

from mtrain.config import register_configs
from mtrain.errors import MtrainError


def find_config_dir(package: Path = Path(__file__).resolve().parents[1]) -> Path:
    """mtrain/configs/ in an installed wheel (pyproject.toml maps configs/ there), else
    configs/ at the top of the checkout (`pip install -e .` or PYTHONPATH=checkout)."""
    installed = package / "configs"
    return installed if installed.is_dir() else package.parent / "configs"


CONFIG_DIR = str(find_config_dir())

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
            if args:
                check_known_keys(args[0])
            return app(*args, **kwargs)
        except MtrainError as error:
            print(f"mtrain: error: {error}", file=sys.stderr)
            if _in_multirun():
                log.error("job failed: %s", error)
                return None
            sys.exit(getattr(error, "exit_status", 2))  # a stop signal exits 128 + its number

    return wrapper


def check_known_keys(cfg: Any, prefix: str = "") -> None:
    """Refuse keys outside the typed schema. Hydra rejects `model.d_modle=512`, but
    `+model.d_modle=512` appends the key even to a typed config, and nothing would read it."""
    schema = OmegaConf.get_type(cfg)
    if not dataclasses.is_dataclass(schema):
        return  # a free-form mapping (e.g. data.hub.splits)
    known = {field.name for field in dataclasses.fields(schema)}
    for key in cfg:
        if key not in known:
            raise MtrainError(f"{prefix}{key}: unknown config key (not in {schema.__name__}); check its spelling")
        child = cfg._get_node(key)
        if isinstance(child, DictConfig):
            check_known_keys(child, f"{prefix}{key}.")


def _in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
