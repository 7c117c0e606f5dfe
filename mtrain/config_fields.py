"""What a config value may be beyond its type: ranges as field metadata, and the walker.

A number's range is written beside its field in mtrain/config/, as the field's default:

    beam: int = ranged(5, at_least=1)
    top_p: float = ranged(0.9, above=0, at_most=1)
    train_limit: int | None = ranged(None, at_least=1)  # null skips the check

A rule between fields of one section is that dataclass's `check(self, prefix)` method.
`check_section` walks a config (a config dataclass, its sections and lists of sections) and
refuses, in one line `<key>: <why>`, the first number that is not finite or outside its
range; each section's `check` runs after its own fields and sections are walked, so a rule
may rely on their ranges (`heads` >= 1 before `d_model % heads`).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any, TypeVar

from mtrain.errors import MtrainError

T = TypeVar("T")


@dataclass(frozen=True)
class Range:
    """The numbers a field may hold: each bound that is set holds (null values are not checked)."""

    at_least: float | None = None
    above: float | None = None
    at_most: float | None = None
    below: float | None = None
    why: str = ""  # said after the bounds: what the bounds mean, or what a value there does
    shown: str = ""  # the bounds as the refusal writes them, where the numbers read badly (2**32)

    def holds(self, value: float) -> bool:
        return (
            (self.at_least is None or value >= self.at_least)
            and (self.above is None or value > self.above)
            and (self.at_most is None or value <= self.at_most)
            and (self.below is None or value < self.below)
        )

    def bounds(self) -> str:
        """`>= 1`, `> 0`, `in [0, 1)`, `in (0, 1]`; both bounds of whole numbers, included: `in 0..65535`."""
        if self.shown:
            return self.shown
        low = self.at_least if self.at_least is not None else self.above
        high = self.at_most if self.at_most is not None else self.below
        if low is not None and high is not None:
            if self.at_least is not None and self.at_most is not None and isinstance(low + high, int):
                return f"in {low}..{high}"
            opening = "[" if self.at_least is not None else "("
            closing = "]" if self.at_most is not None else ")"
            return f"in {opening}{low}, {high}{closing}"
        if low is not None:
            return f">= {low}" if self.at_least is not None else f"> {low}"
        return f"<= {high}" if self.at_most is not None else f"< {high}"


def ranged(
    default: T,
    *,
    at_least: float | None = None,
    above: float | None = None,
    at_most: float | None = None,
    below: float | None = None,
    why: str = "",
    shown: str = "",
) -> T:
    """A field whose value `check_section` keeps within these bounds (`default` is its default)."""
    limits = Range(at_least, above, at_most, below, why, shown)
    return field(default=default, metadata={"range": limits})


def range_of(schema_field: dataclasses.Field[Any]) -> Range | None:
    return schema_field.metadata.get("range")


def check_section(section: Any, prefix: str = "") -> None:
    """Raise MtrainError("<prefix>.<key>: <why>") for the first value of `section` (a config
    dataclass) or its sections that is not finite or outside its field's range, or that a
    section's `check` refuses."""
    schema = type(section)
    hints = typing.get_type_hints(schema)
    for schema_field in dataclasses.fields(section):
        name = schema_field.name
        key = f"{prefix}.{name}" if prefix else name
        value = getattr(section, name)
        _check_value(key, value, range_of(schema_field), optional=_allows_none(hints[name]))
    check = getattr(section, "check", None)
    if check is not None:
        check(prefix)


def _check_value(key: str, value: Any, limits: Range | None, optional: bool) -> None:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        check_section(value, key)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _check_value(f"{key}[{index}]", item, None, optional=False)
    elif isinstance(value, float) and not math.isfinite(value):
        # no key means anything by inf or nan, and `> 0` would let inf through
        raise MtrainError(f"{key}: {value} must be a finite number")
    elif limits is not None and value is not None and not limits.holds(value):
        why = limits.why or ("(or null)" if optional else "")
        separator = "" if why.startswith(",") else " "
        raise MtrainError(f"{key}: {value} must be {limits.bounds()}" + (f"{separator}{why}" if why else ""))


def _allows_none(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint)
