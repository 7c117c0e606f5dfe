"""The names of config keys: "did you mean" for a misspelt key or preset, and what a schema's
keys are (every dotted key, which ones take lists), read from the config dataclasses.

mtrain.cli.common asks these while it reads a command line, mtrain.config_checks when it
refuses an unknown key; neither needs more of the schema than its field names and types.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from collections.abc import Iterator, Sequence
from typing import Any

# Words that name a model's size in a preset's name, smallest first: `transformer_tiny` is
# nearest `transformer_small`, though spelt more like `transformer_big`.
SIZE_WORDS = ("tiny", "small", "base", "medium", "big", "large", "huge")


def did_you_mean(word: str, candidates: Sequence[str], prefix: str = "") -> str:
    """' (did you mean <prefix><closest>?)', or '' when nothing is close. A name that differs
    from candidates only in its size word gets the nearest sizes (`closest_sizes`)."""
    close = closest_sizes(word, candidates) or difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return _suggestion(close, prefix)


def did_you_mean_key(key: str, known: Sequence[str]) -> str:
    """' (did you mean <key>?)' for an unknown dotted config key, or '' when none is close:
    the known keys whose last part is `key`'s (`beam` -> decode.beam, as fairseq habits type
    it; `-` read as `_`, so `max-tokens` -> train.max_tokens), else the closest whole key
    (`train.max_tiem` -> train.max_time), else the keys whose last part is closest (`max_tiem`)."""

    def last_part(name: str) -> str:
        return name.rsplit(".", 1)[-1].replace("-", "_").lower()

    def by_likeness(names: list[str]) -> list[str]:
        return sorted(names, key=lambda name: -difflib.SequenceMatcher(None, key, name).ratio())

    same_last = [name for name in known if last_part(name) == last_part(key) and name != key]
    if same_last:
        return _suggestion(by_likeness(same_last))
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    if close:
        return _suggestion(close)
    close_last = difflib.get_close_matches(
        last_part(key), sorted({last_part(name) for name in known}), n=1, cutoff=0.75
    )
    return _suggestion(by_likeness([name for name in known if close_last and last_part(name) == close_last[0]]))


def closest_sizes(word: str, candidates: Sequence[str]) -> list[str]:
    """The candidates that differ from `word` only in a size word (SIZE_WORDS, between `_`, `-`
    or `.`), the nearest size(s) first: `transformer_tiny` -> [transformer_small]; [] when
    `word` has no size word or no candidate differs from it only there."""
    parts = re.split(r"([_.-])", word)
    sized = [i for i, part in enumerate(parts) if part.lower() in SIZE_WORDS]
    if len(sized) != 1:
        return []
    index, size = sized[0], SIZE_WORDS.index(parts[sized[0]].lower())
    distance: dict[str, int] = {}
    for candidate in candidates:
        other = re.split(r"([_.-])", candidate)
        if (
            candidate != word
            and len(other) == len(parts)
            and other[index].lower() in SIZE_WORDS
            and all(a == b for i, (a, b) in enumerate(zip(parts, other, strict=True)) if i != index)
        ):
            distance[candidate] = abs(SIZE_WORDS.index(other[index].lower()) - size)
    nearest = min(distance.values(), default=None)
    return [candidate for candidate, d in distance.items() if d == nearest]


def _suggestion(names: Sequence[str], prefix: str = "", most: int = 3) -> str:
    if not names:
        return ""
    return f" (did you mean {' or '.join(f'{prefix}{name}' for name in names[:most])}?)"


def schema_keys(schema: type, prefix: str = "") -> Iterator[str]:
    """Every dotted key of a config dataclass, nested sections included."""
    for field in dataclasses.fields(schema):
        key = f"{prefix}{field.name}"
        yield key
        field_type = typing.get_type_hints(schema)[field.name]
        if isinstance(field_type, type) and dataclasses.is_dataclass(field_type):
            yield from schema_keys(field_type, f"{key}.")


def takes_a_list(schema: type | None, key: str) -> bool:
    """Whether the dotted `key` of a config dataclass is a list (True when it is not found:
    a list is then the likelier reading of `a,b`)."""
    field_type: Any = schema
    for name in key.split("."):
        if not (dataclasses.is_dataclass(field_type) and name in {f.name for f in dataclasses.fields(field_type)}):
            return True
        field_type = typing.get_type_hints(field_type)[name]
    while typing.get_origin(field_type) in (typing.Union, types.UnionType):  # list[str] | None
        field_type = next(arg for arg in typing.get_args(field_type) if arg is not type(None))
    return typing.get_origin(field_type) in (list, tuple) or field_type in (list, tuple)


def list_item_schema(schema: type | None, key: str) -> type | None:
    """The config dataclass of the items of the list at dotted `key` (CorpusConfig for
    data.corpora of FitConfig); None when `key` is not a list of config dataclasses."""
    field_type: Any = schema
    for name in key.split("."):
        if not (dataclasses.is_dataclass(field_type) and name in {f.name for f in dataclasses.fields(field_type)}):
            return None
        field_type = typing.get_type_hints(field_type)[name]
    if typing.get_origin(field_type) is list:
        item = typing.get_args(field_type)[0]
        return item if isinstance(item, type) and dataclasses.is_dataclass(item) else None
    return None
