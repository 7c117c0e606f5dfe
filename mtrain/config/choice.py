"""A config key's fixed set of allowed strings: the base of every choice enum of the schema."""

from __future__ import annotations

from enum import Enum


class Choice(str, Enum):
    """One of a fixed set of strings (a config key's allowed values).

    OmegaConf refuses any other value when the config is composed, naming the key. A member
    is a `str` equal to its value and prints as it, so `cfg.model.norm_position == "pre"`,
    `f"{cfg.train.precision}"`, JSON and the YAML spellings are unchanged.
    """

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)
