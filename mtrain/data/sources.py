"""Where a parallel corpus comes from, decided once: local files or the Hugging Face Hub.

Resolution when the user names no path: `data.local_dir` if set, else
`$MTRAIN_DATA_DIR/<data.name>` if it holds the corpus, else `data.hub.id`. When nothing can
be read, the error lists every place that was tried and how to point mtrain at the data.

Every source streams `(source sentence, target sentence)` pairs of one split (our names:
train, valid, test) and has a cheap fingerprint of that split, used as a cache key.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mtrain.config import DataConfig, DataFormat, InvalidUtf8
from mtrain.data.hub import HubSource
from mtrain.data.local_files import LocalSource, file_names
from mtrain.data.text import SPLITS, Pair, ParallelSource, ParallelText, ReadStats, clean_text
from mtrain.errors import MtrainError

__all__ = [
    "SPLITS",
    "Pair",
    "ParallelSource",
    "ParallelText",
    "ReadStats",
    "check_data_config",
    "clean_text",
    "resolve_source",
]


def check_data_config(cfg: DataConfig) -> None:
    """Reject settings that would only fail later, naming the key."""
    if cfg.src == cfg.tgt:
        raise MtrainError(f"data.src and data.tgt are both '{cfg.src}'; choose two languages")
    if cfg.format not in tuple(DataFormat):
        raise MtrainError(f"data.format={cfg.format}: expected text, tsv or jsonl")
    if cfg.invalid_utf8 not in tuple(InvalidUtf8):
        raise MtrainError(f"data.invalid_utf8={cfg.invalid_utf8}: expected skip or error")
    if cfg.train_limit is not None and cfg.train_limit <= 0:
        raise MtrainError(f"data.train_limit={cfg.train_limit}: expected a positive number or null")
    if cfg.chunk_size <= 0 or cfg.num_workers <= 0:
        raise MtrainError("data.chunk_size and data.num_workers must be positive")


class WithoutTestSplit:
    """A source whose test split is empty: `data.splits.test=null` (the rest is delegated)."""

    def __init__(self, source: ParallelSource) -> None:
        self.source = source
        self.description = source.description

    def fingerprint(self, split: str) -> str:
        return "no test split" if split == "test" else self.source.fingerprint(split)

    def pairs(self, split: str, stats: ReadStats) -> Iterator[Pair]:
        return iter(()) if split == "test" else self.source.pairs(split, stats)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.source, name)


def resolve_source(cfg: DataConfig) -> ParallelSource:
    """Pick the corpus location for `cfg` as the module docstring describes;
    with `data.splits.test=null` its test split is empty."""
    source = _resolve_source(cfg)
    return source if cfg.splits.test is not None else WithoutTestSplit(source)


def _resolve_source(cfg: DataConfig) -> ParallelSource:
    check_data_config(cfg)
    if cfg.local_dir:
        source = LocalSource(Path(cfg.local_dir).expanduser(), cfg)
        missing = source.missing_files()
        if missing:
            raise MtrainError(
                f"data.local_dir={cfg.local_dir}: missing {', '.join(missing)} "
                f"(data.format={cfg.format}, data.pattern='{cfg.pattern}', splits "
                f"{_split_names(cfg)}); fix data.local_dir, data.pattern or data.splits.*"
            )
        return source

    tried = ["data.local_dir is not set"]
    env_dir = os.environ.get("MTRAIN_DATA_DIR")
    if env_dir:
        directory = Path(env_dir).expanduser() / cfg.name
        if directory.is_dir():
            source = LocalSource(directory, cfg)
            missing = source.missing_files()
            if not missing:
                return source
            _refuse_a_language_the_local_copy_lacks(cfg, directory)
            tried.append(f"$MTRAIN_DATA_DIR/{cfg.name} = {directory} lacks {', '.join(missing)}")
        else:
            tried.append(f"$MTRAIN_DATA_DIR/{cfg.name} = {directory} does not exist")
    else:
        tried.append("$MTRAIN_DATA_DIR is not set")

    if cfg.hub.id:
        return HubSource(cfg, tried)
    tried.append(f"no Hub dataset: data.hub.id is not set for data={cfg.name}")
    raise MtrainError(
        f"no corpus found for data={cfg.name} ({cfg.src}->{cfg.tgt}); tried: {'; '.join(tried)}. "
        f"Set data.local_dir=DIR (files {_example_files(cfg)}), or MTRAIN_DATA_DIR=DIR "
        f"holding DIR/{cfg.name}/, or data.hub.id=<Hugging Face dataset>"
    )


def _refuse_a_language_the_local_copy_lacks(cfg: DataConfig, directory: Path) -> None:
    """A local copy of the corpus that holds every split in other languages but not in
    data.src/data.tgt: most likely a mistyped language code, so say so at once rather than
    asking the Hub (which, offline, retries for half a minute)."""
    if not DataFormat(cfg.format).one_file_per_language:
        return
    present = sorted(_local_languages(cfg, directory))
    absent = [lang for lang in (cfg.src, cfg.tgt) if lang not in present]
    if present and absent:
        keys = ", ".join(f"data.{side}={lang}" for side, lang in (("src", cfg.src), ("tgt", cfg.tgt)) if lang in absent)
        raise MtrainError(
            f"{keys}: the local copy of data={cfg.name} ({directory}, from $MTRAIN_DATA_DIR) has the "
            f"languages {', '.join(present)} only; check the language code (to read {cfg.name} from the "
            "Hub instead, unset MTRAIN_DATA_DIR or set data.local_dir)"
        )


def _local_languages(cfg: DataConfig, directory: Path) -> set[str]:
    """The languages whose files for every split (data.pattern) are all in `directory`."""
    found = None
    for split in ("train", "valid", "test"):
        split_name = getattr(cfg.splits, split)
        if split_name is None:
            continue
        # The pattern with `{lang}` as the one unknown: split and direction filled in.
        prefix, _, suffix = (
            cfg.pattern.replace("{split}", str(split_name))
            .replace("{src}", cfg.src)
            .replace("{tgt}", cfg.tgt)
            .partition("{lang}")
        )
        languages = set()
        for path in directory.iterdir():
            name = path.name[:-3] if path.name.endswith(".gz") else path.name
            if (
                path.is_file()
                and name.startswith(prefix)
                and name.endswith(suffix)
                and len(name) > len(prefix) + len(suffix)
            ):
                languages.add(name[len(prefix) : len(name) - len(suffix)])
        found = languages if found is None else found & languages
    return found or set()


def _split_names(cfg: DataConfig) -> str:
    return f"train={cfg.splits.train}, valid={cfg.splits.valid}, test={cfg.splits.test}"


def _example_files(cfg: DataConfig) -> str:
    names = [name for split in ("train", "valid") for name in file_names(cfg, split)]
    return ", ".join(f"{name}[.gz]" for name in names) + ", ..."
