"""A config as plain containers (checkpoints, JSON, cache keys) or as its dataclass (what library
functions take), and a section with some values changed."""

from __future__ import annotations

import dataclasses
from typing import Any

from omegaconf import OmegaConf


def to_plain(cfg: Any) -> Any:
    """A config (OmegaConf node or config dataclass) as plain Python containers, for
    checkpoints, JSON reports and cache keys; choices become plain strings, so a checkpoint
    holding it still loads with torch.load(weights_only=True). Anything else is returned as is."""
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        cfg = OmegaConf.structured(cfg)
    if OmegaConf.is_config(cfg):
        return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    return cfg


def to_typed(cfg: Any) -> Any:
    """A composed config (or section) as its dataclass, what library functions take; choices
    become their Enum members. A config dataclass is returned as it is."""
    if OmegaConf.is_config(cfg):
        return OmegaConf.to_object(cfg)
    return cfg


def with_values(section: Any, **values: Any) -> Any:
    """A copy of a config section (a config dataclass or an OmegaConf node) with `values` changed."""
    if dataclasses.is_dataclass(section) and not isinstance(section, type):
        return dataclasses.replace(section, **values)
    return OmegaConf.merge(section, values)
