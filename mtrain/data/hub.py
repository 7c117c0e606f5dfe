"""Parallel corpora from Hugging Face `datasets`: a Hub id, or a local copy of one.

`data.hub.id` is passed to `datasets.load_dataset` as is, so it can also be a directory on
disk holding parquet/JSON files or a downloaded dataset repository (how tests and offline
machines use this path). The dataset is converted to Arrow files once by `datasets` and then
read in batches from those memory-mapped files, so even WMT-size splits stream.

Two layouts are understood: a dict column such as wmt14's `translation` = {"de": ..., "en":
...} (`data.hub.translation_field`), or one column per language (`translation_field: null`,
columns `data.hub.src_field`/`tgt_field`, defaulting to the language codes).

`datasets` 4 and later refuse datasets built by a loading script (IWSLT/iwslt2017 is one).
The Hub keeps a parquet export of most of them on the `refs/convert/parquet` branch, laid out
as `<config>/<split>/NNNN.parquet` (`<config>/partial-<split>/` when a big split was cut
short); a refused script makes mtrain read that export instead and say so.
`data.hub.revision=refs/convert/parquet` goes there directly (also for a local copy of it).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mtrain.config import DataConfig
from mtrain.data.text import Pair, ReadStats, clean_text
from mtrain.errors import MtrainError

READ_BATCH = 2000  # rows per Arrow batch while streaming a split
PARQUET_EXPORT = "refs/convert/parquet"

log = logging.getLogger("mtrain")


# Libraries that give their loggers a console handler of their own and also pass each record
# on to the root logger, whose console handler (Hydra's) printed it a second time.
OWN_CONSOLE_LOGGERS = ("datasets", "huggingface_hub")


def print_library_warnings_once() -> None:
    """Keep each of `OWN_CONSOLE_LOGGERS`' lines (retries, an unreachable Hub) to its own
    handler: one copy on the console instead of two."""
    for name in OWN_CONSOLE_LOGGERS:
        library_log = logging.getLogger(name)
        if library_log.handlers:
            library_log.propagate = False


def load_hub_split(dataset_id: str, config: str | None, split: str, revision: str | None = None) -> Any:
    """The one call into `datasets` (tests replace it to simulate an unreachable Hub)."""
    import datasets

    print_library_warnings_once()

    if revision == PARQUET_EXPORT:
        files = parquet_export_files(dataset_id, config, split)
        return datasets.load_dataset("parquet", data_files={split: files}, split=split)
    return datasets.load_dataset(dataset_id, config, split=split, revision=revision)


def parquet_export_files(dataset_id: str, config: str | None, split: str) -> list[str]:
    """The parquet files of `split` in the Hub's export of `dataset_id` (or in a local copy of
    that export): `<config>/<split>/*.parquet`, else `<config>/partial-<split>/*.parquet`."""
    from datasets.data_files import resolve_pattern

    local = Path(dataset_id).expanduser()
    base = str(local) if local.is_dir() else f"hf://datasets/{dataset_id}@{PARQUET_EXPORT}"
    folder = config or "default"  # the export names a dataset without configs "default"
    try:
        files: list[str] = resolve_pattern(f"{folder}/{split}/*.parquet", base_path=base)  # (`datasets` is untyped)
        return files
    except FileNotFoundError:
        pass
    try:
        files = resolve_pattern(f"{folder}/partial-{split}/*.parquet", base_path=base)
    except FileNotFoundError:
        raise FileNotFoundError(f"its parquet export ({PARQUET_EXPORT}) has no {folder}/{split}/ folder") from None
    log.warning(
        "data: the parquet export of %s holds only the first part of split %s (%s/partial-%s/)",
        dataset_id,
        split,
        folder,
        split,
    )
    return files


class HubSource:
    """A corpus read through `datasets.load_dataset(data.hub.id, data.hub.config)`."""

    def __init__(self, cfg: DataConfig, tried: list[str]) -> None:
        self.cfg = cfg
        self.hub = cfg.hub
        self.tried = tried  # what resolution tried before the Hub, for error messages
        config = f", config {self.hub.config}" if self.hub.config else ""
        revision = f", revision {self.hub.revision}" if self.hub.revision else ""
        self.description = f"Hugging Face dataset {self.hub.id}{config}{revision}"

    def _split_name(self, split: str) -> str:
        if split not in self.hub.splits:
            raise MtrainError(f"data.hub.splits has no entry for '{split}' (it has {sorted(self.hub.splits)})")
        return self.hub.splits[split]

    def fingerprint(self, split: str) -> str:
        parts = [str(self.hub.id), str(self.hub.config), self._split_name(split)]
        if self.hub.revision:  # (only when set: caches made before the key existed stay valid)
            parts.append(f"revision={self.hub.revision}")
        local = Path(str(self.hub.id)).expanduser()
        if local.exists():  # a local copy: its files' sizes and mtimes stand for its content
            # Hidden files (download tools' metadata and locks) say nothing about the content.
            files = (
                [local]
                if local.is_file()
                else sorted(
                    p
                    for p in local.rglob("*")
                    if p.is_file() and not any(part.startswith(".") for part in p.relative_to(local).parts)
                )
            )
            parts += [f"{p.resolve()}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files]
        return "|".join(parts)

    def load(self, split: str) -> Any:
        """The split as a `datasets.Dataset`, its columns checked against the field mapping."""
        hub_split = self._split_name(split)
        revision = f", revision {self.hub.revision}" if self.hub.revision else ""
        where = f"data.hub.id={self.hub.id} (config {self.hub.config}, split {hub_split}{revision})"
        try:
            dataset = self._load_or_read_export(hub_split)
        except ConnectionError as error:  # also huggingface_hub's offline-mode errors
            raise MtrainError(
                f"{where}: the Hugging Face Hub cannot be reached ({error}). Already tried: "
                f"{'; '.join(self.tried)}. Offline, put the corpus in local files and set "
                f"data.local_dir=DIR (or MTRAIN_DATA_DIR=DIR with DIR/{self.cfg.name}/), or copy "
                "the dataset repository to disk and set data.hub.id=/path/to/copy "
                "(HF_HUB_OFFLINE=1 makes this check fail at once instead of after retries)"
            ) from error
        except FileNotFoundError as error:  # includes datasets' DatasetNotFoundError
            raise MtrainError(
                f"{where}: dataset not found ({error}); check data.hub.id, or use local files "
                f"with data.local_dir=DIR. Already tried: {'; '.join(self.tried)}"
            ) from error
        except ValueError as error:  # an unknown config or split name; the message lists the valid ones
            raise MtrainError(f"{where}: {error}; fix data.hub.config or data.hub.splits.{split}") from error
        self._check_columns(dataset, where)
        return dataset

    def _load_or_read_export(self, hub_split: str) -> Any:
        """The split at data.hub.revision; the parquet export when that holds a loading script."""
        assert self.hub.id is not None  # a HubSource is made only for a set data.hub.id (sources.py)
        try:
            return load_hub_split(self.hub.id, self.hub.config, hub_split, self.hub.revision)
        except RuntimeError as error:
            if "scripts are no longer supported" not in str(error):
                raise
        log.warning(
            "data: %s is built by a loading script, which the installed `datasets` no longer runs; "
            "reading the Hub's parquet export instead (data.hub.revision=%s goes there directly)",
            self.hub.id,
            PARQUET_EXPORT,
        )
        return load_hub_split(self.hub.id, self.hub.config, hub_split, PARQUET_EXPORT)

    def _check_columns(self, dataset: Any, where: str) -> None:
        columns = list(dataset.column_names)
        field = self.hub.translation_field
        if field:
            if field not in columns:
                raise MtrainError(
                    f"{where}: data.hub.translation_field='{field}' is not a column; the dataset "
                    f"has columns {columns}. Name the right column, or set data.hub.translation_field"
                    "=null with data.hub.src_field/tgt_field for one column per language"
                )
            feature = dataset.features[field]
            languages = list(getattr(feature, "languages", None) or (feature if isinstance(feature, dict) else []))
            if not languages:
                raise MtrainError(
                    f"{where}: column '{field}' is {feature}, not a {{language: text}} dict; set "
                    "data.hub.translation_field=null and data.hub.src_field/tgt_field instead"
                )
            missing = [lang for lang in (self.cfg.src, self.cfg.tgt) if lang not in languages]
            if missing:
                raise MtrainError(
                    f"{where}: column '{field}' has languages {languages}, not {missing}; "
                    "check data.src/data.tgt (or data.hub.config)"
                )
            return
        fields = (("src_field", self.hub.src_field or self.cfg.src), ("tgt_field", self.hub.tgt_field or self.cfg.tgt))
        for key, name in fields:
            if name not in columns:
                raise MtrainError(f"{where}: no column '{name}' (data.hub.{key}); the dataset has columns {columns}")

    def pairs(self, split: str, stats: ReadStats) -> Iterator[Pair]:
        dataset = self.load(split)
        field = self.hub.translation_field
        src, tgt = self.cfg.src, self.cfg.tgt
        if field:
            for batch in dataset.select_columns([field]).iter(batch_size=READ_BATCH):
                for record in batch[field]:
                    stats.pairs += 1
                    yield clean_text(record[src] or "", stats), clean_text(record[tgt] or "", stats)
        else:
            src_column, tgt_column = self.hub.src_field or src, self.hub.tgt_field or tgt
            for batch in dataset.select_columns([src_column, tgt_column]).iter(batch_size=READ_BATCH):
                for src_text, tgt_text in zip(batch[src_column], batch[tgt_column], strict=True):
                    stats.pairs += 1
                    yield clean_text(src_text or "", stats), clean_text(tgt_text or "", stats)
