"""The training corpora of a run and the sources of its evaluation sets, resolved once.

Without `data.corpora` the run trains on `data` itself: one corpus, whose source also holds
the validation and test splits. With `data.corpora`, each entry is a corpus of its own: a
`DataConfig` derived from `data` (unset keys take data's values; `local_dir` and `hub` only
when the entry has data's name, since another name is another corpus, found as data is:
`$MTRAIN_DATA_DIR/<name>`, then its Hub id) of which only the training split is read.
Validation and test sets then come from `data`'s source, one pair per direction trained.

A corpus that cannot be found, or a direction whose evaluation files are missing, is refused
here with one line naming the config key (`data.corpora[i]...`) and the path or language.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtrain.config import DataConfig, DataFormat, SplitsConfig, to_typed
from mtrain.data.local_files import LocalSource, file_names
from mtrain.data.provenance import read_provenance
from mtrain.data.sources import ParallelSource, WithoutTestSplit, resolve_source
from mtrain.data.tags import Direction, run_directions
from mtrain.errors import MtrainError


@dataclass
class TrainingCorpus:
    """One corpus a run trains on: where it is read from and how it enters training."""

    key: str  # its config key in messages: "data", or "data.corpora[i]"
    label: str  # its name in logs, metrics and cache entries
    cfg: DataConfig  # what reading it needs (src, tgt, format, pattern, splits.train, train_limit...)
    source: ParallelSource
    weight: float = 1.0
    tag: str | None = None

    @property
    def direction(self) -> Direction:
        return (self.cfg.src, self.cfg.tgt)

    def provenance(self) -> list[dict[str, Any]]:
        """What `mtrain translate` recorded beside this corpus's training files (which model
        produced them, with which settings); [] for files it did not write."""
        source = self.source.source if isinstance(self.source, WithoutTestSplit) else self.source
        if not isinstance(source, LocalSource):
            return []
        return [record for path in source.files("train") if (record := read_provenance(path)) is not None]


def corpus_config(data: DataConfig, index: int) -> DataConfig:
    """The DataConfig of data.corpora[index], as the module docstring says: unset keys take
    data's values; only the training split (the entry's `split`, else data.splits.train) is named."""
    data = to_typed(data)
    corpus = data.corpora[index]
    same_corpus = corpus.name is None or corpus.name == data.name
    hub = corpus.hub or (data.hub if same_corpus else dataclasses.replace(data.hub, id=None, config=None))
    if corpus.split is not None:
        hub = dataclasses.replace(hub, splits={**hub.splits, "train": corpus.split})
    # Only the training split is read; valid/test of None are not looked for (see local_files.file_names).
    splits = SplitsConfig(train=corpus.split or data.splits.train, valid=None, test=None)  # type: ignore[arg-type]
    return dataclasses.replace(
        data,
        name=corpus.name or data.name,
        src=corpus.src or data.src,
        tgt=corpus.tgt or data.tgt,
        local_dir=corpus.local_dir or (data.local_dir if same_corpus else None),
        format=corpus.format or data.format,
        pattern=corpus.pattern or data.pattern,
        splits=splits,
        hub=hub,
        train_limit=corpus.train_limit if corpus.train_limit is not None else data.train_limit,
        corpora=[],
    )


def training_corpora(data: DataConfig, data_source: ParallelSource | None = None) -> list[TrainingCorpus]:
    """Every corpus the run trains on, its source resolved; `data_source` is data's own
    (resolved by the caller) for the single-corpus case."""
    if not data.corpora:
        return [TrainingCorpus("data", data.name, data, data_source or resolve_source(data))]
    corpora: list[TrainingCorpus] = []
    names = [corpus.name or data.name for corpus in data.corpora]
    for index, corpus in enumerate(data.corpora):
        cfg = corpus_config(data, index)
        key = f"data.corpora[{index}]"
        # Two entries may read the same corpus (e.g. de-en and en-de of Multi30k): their
        # labels tell them apart in logs and metrics.
        label = cfg.name if names.count(cfg.name) == 1 else f"{cfg.name}.{cfg.src}-{cfg.tgt}"
        if label in (c.label for c in corpora):
            label = f"{label}.{index}"
        corpora.append(TrainingCorpus(key, label, cfg, _resolve_corpus(cfg, key), float(corpus.weight), corpus.tag))
    return corpora


def _resolve_corpus(cfg: DataConfig, key: str) -> ParallelSource:
    if cfg.local_dir:
        directory = Path(cfg.local_dir).expanduser()
        missing = LocalSource(directory, cfg).missing_files()
        if missing or not directory.is_dir():
            raise MtrainError(
                f"{key}.local_dir={cfg.local_dir}: cannot read {', '.join(missing) or directory} "
                f"(format {cfg.format}, pattern '{cfg.pattern}', split '{cfg.splits.train}'); fix "
                f"{key}.local_dir, {key}.pattern or {key}.split"
            )
    try:
        return resolve_source(cfg)
    except MtrainError as error:
        raise MtrainError(f"{key} (name {cfg.name}, {cfg.src}->{cfg.tgt}): {error}") from error


def evaluation_sources(data: DataConfig, corpora: list[TrainingCorpus]) -> dict[Direction, ParallelSource]:
    """The source of the validation and test splits of each direction trained: data's own."""
    if not data.corpora:
        return {corpora[0].direction: corpora[0].source}
    data = to_typed(data)
    sources: dict[Direction, ParallelSource] = {}
    first_local: Path | None = None
    for src, tgt in run_directions(data):
        key = next(c.key for c in corpora if c.direction == (src, tgt))
        # Only valid/test are read from data; its training split need not exist (None: not
        # looked for, as in corpus_config; the schema keeps str, so a user cannot null it).
        splits = dataclasses.replace(data.splits, train=None)  # type: ignore[arg-type]
        cfg = dataclasses.replace(data, src=src, tgt=tgt, corpora=[], splits=splits)
        if first_local is not None:  # the same folder for every direction: no Hub lookup per direction
            source = LocalSource(first_local, cfg)
            _check_evaluation_files(source, cfg, key)
            sources[(src, tgt)] = source if cfg.splits.test is not None else WithoutTestSplit(source)
            continue
        try:
            resolved = resolve_source(cfg)
        except MtrainError as error:
            raise MtrainError(
                f"{key} ({src}->{tgt}): no validation/test data in data={data.name} for this direction: {error}"
            ) from error
        inner = resolved.source if isinstance(resolved, WithoutTestSplit) else resolved
        if isinstance(inner, LocalSource):
            first_local = inner.directory
        sources[(src, tgt)] = resolved
    return sources


def _check_evaluation_files(source: LocalSource, cfg: DataConfig, key: str) -> None:
    """Refuse a direction whose validation/test files are not in data's folder, naming the
    language that lacks them."""
    missing = source.missing_files()
    if not missing:
        return
    absent = [f"{key} ({cfg.src}->{cfg.tgt})"]
    if DataFormat(cfg.format).one_file_per_language:  # file_names lists the source's file, then the target's
        names = [file_names(cfg, split) for split in ("valid", "test") if file_names(cfg, split)]
        absent = [
            f"{key}.{side}={lang}"
            for position, (side, lang) in enumerate((("src", cfg.src), ("tgt", cfg.tgt)))
            if any(f"{split[position]}[.gz]" in missing for split in names)
        ]
    raise MtrainError(
        f"{', '.join(absent)}: data={cfg.name} has no validation/test data in this language "
        f"({source.directory} lacks {', '.join(missing)}); every direction data.corpora trains is "
        "validated and tested on data's own splits"
    )
