"""What an export says about the machine it was written on: no absolute path of it.

A package (format=hf, format=argos) is published and installed elsewhere, where a path of the
exporting machine means nothing and tells who exported it, and where. A CTranslate2 directory
is read back by mtrain too (`mtrain eval run=EXPORT` scores the run's test split), so its record
keeps the way to the run and its corpus, relative to the export directory.

    portable(value)            every absolute path in a config, an override list or a text cut to
                               `…/<its last name>` (model cards, Argos's metadata and README)
    name_in_run(path, run)     `checkpoints/best.pt`: a path inside the run relative to it, else its name
    relative_paths(data, to)   a data config's directories relative to the export directory `to`
                               (the CTranslate2 record), `resolved_paths` reads them back
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

ELIDED = "…/"
# An absolute POSIX path, a home-relative one, or a Windows drive path, where a value starts in
# a text (its start, after a space, a quote, `=`, a bracket or a comma): not `</s>`, not `a/b`.
_ABSOLUTE = re.compile(
    r"""(?:^|(?<=[\s'"`=(\[{,]))(?:~|[A-Za-z]:)?[/\\](?:[^\s'"`,;:=()\[\]{}]+[/\\])*([^\s'"`,;:=()\[\]{}/\\]+)""",
    re.MULTILINE,
)
# The directories of a data config (and of each of its corpora).
DATA_PATH_KEYS = ("local_dir", "cache_dir")
# What the CTranslate2 record says of its paths (absent in records written before).
RELATIVE_TO_EXPORT = "relative to the export directory"


def portable(value: Any) -> Any:
    """`value` (dicts, lists, strings, as JSON and YAML hold them) with every absolute path cut
    to `…/<its last name>`: `data.local_dir=/home/me/corpora/m30k` becomes `data.local_dir=…/m30k`."""
    if isinstance(value, dict):
        return {key: portable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [portable(item) for item in value]
    if isinstance(value, str):
        return _ABSOLUTE.sub(lambda match: ELIDED + match.group(1), value)
    return value


def name_in_run(path: Path, run_dir: Path) -> str:
    """`path` relative to the run directory when it lies in it (`checkpoints/best.pt`), else its name."""
    resolved, run = Path(path).resolve(), Path(run_dir).resolve()
    return resolved.relative_to(run).as_posix() if resolved.is_relative_to(run) else resolved.name


def relative_to(path: str | Path, directory: Path) -> str:
    """`path` (absolute, or relative to the working directory) relative to `directory`, when the
    two share a directory below the root; else `…/<its name>`: a path that climbs to the root would
    be the absolute path again."""
    target, base = Path(path).resolve(), Path(directory).resolve()
    if Path(os.path.commonpath([target, base])) == Path(base.anchor):
        return ELIDED + target.name
    return Path(os.path.relpath(target, base)).as_posix()


def relative_paths(data: dict[str, Any], directory: Path) -> dict[str, Any]:
    """A data config (plain) with its directories relative to `directory`."""
    return _map_data_paths(data, lambda path: relative_to(path, directory))


def resolved_paths(data: dict[str, Any], directory: Path) -> dict[str, Any]:
    """The inverse of `relative_paths`: the directories as paths from here."""
    return _map_data_paths(
        data, lambda path: path if path.startswith(ELIDED) else os.path.normpath(Path(directory) / path)
    )


def _map_data_paths(data: dict[str, Any], change: Callable[[str], str]) -> dict[str, Any]:
    def mapped(section: dict[str, Any]) -> dict[str, Any]:
        return {key: change(str(v)) if key in DATA_PATH_KEYS and v is not None else v for key, v in section.items()}

    result = mapped(data)
    if isinstance(result.get("corpora"), list):
        result["corpora"] = [mapped(corpus) if isinstance(corpus, dict) else corpus for corpus in result["corpora"]]
    return result
