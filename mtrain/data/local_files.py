"""Parallel corpora in local files: plain or gzip, as line-aligned text, TSV or JSONL.

- `text`: one file per language, `data.pattern` (default `{split}.{lang}`) names them;
  line N of the source file translates line N of the target file.
- `tsv`: one file per split, `source<TAB>target` per line (columns in data.src, data.tgt order).
- `jsonl`: one file per split, one object per line whose keys are the language codes,
  either at the top level or inside a `translation` object (the Hub's layout).

`NAME.gz` is tried when `NAME` is absent. Lines are read as bytes and decoded one by one so
that a bad line is reported by file and line number: a UTF-8 byte-order mark, CRLF endings
and NUL bytes are repaired; undecodable lines follow `data.invalid_utf8` (skip the pair and
count it, or fail). Everything streams; no split is ever held in memory whole.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator
from itertools import zip_longest
from pathlib import Path

from mtrain.config import DataConfig, DataFormat, InvalidUtf8
from mtrain.data.text import Pair, ReadStats, clean_text
from mtrain.errors import MtrainError

BOM = b"\xef\xbb\xbf"


def file_names(cfg: DataConfig, split: str) -> list[str]:
    """The file name(s) of one split (our split name: train, valid or test), without `.gz`."""
    split_name = getattr(cfg.splits, split)
    if split_name is None:  # data.splits.test=null: no files to look for
        return []
    per_language = DataFormat(cfg.format).one_file_per_language
    languages = [cfg.src, cfg.tgt] if per_language else [None]
    if per_language != ("{lang}" in cfg.pattern):
        need = "needs" if per_language else "must not contain"
        raise MtrainError(
            f"data.pattern='{cfg.pattern}': data.format={cfg.format} {need} a {{lang}} placeholder "
            f"(e.g. '{{split}}.{{lang}}' for text, '{{split}}.{cfg.format}' for tsv/jsonl)"
        )
    try:
        return [cfg.pattern.format(split=split_name, lang=lang, src=cfg.src, tgt=cfg.tgt) for lang in languages]
    except (KeyError, IndexError, ValueError) as error:
        raise MtrainError(
            f"data.pattern='{cfg.pattern}': only {{split}}, {{lang}}, {{src}} and {{tgt}} may appear ({error})"
        ) from error


def read_lines(path: Path) -> Iterator[bytes]:
    """The raw lines of a plain or gzip file; a corrupted or truncated file is a clear error."""
    line_number = 0
    try:
        with gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb") as lines:
            for line in lines:
                line_number += 1
                yield line
    except (OSError, EOFError, zlib.error) as error:
        raise MtrainError(
            f"{path}: unreadable after line {line_number} ({error}); the file is corrupted or "
            "truncated: download or decompress it again (`gzip -t` checks a .gz file)"
        ) from error


class LocalSource:
    """A corpus in `directory`, laid out as `data.format` and `data.pattern` say."""

    def __init__(self, directory: Path, cfg: DataConfig) -> None:
        self.directory = directory
        self.cfg = cfg
        self.description = f"local files in {directory} (format {cfg.format}, pattern '{cfg.pattern}')"

    def _find(self, name: str) -> Path | None:
        for candidate in (self.directory / name, self.directory / f"{name}.gz"):
            if candidate.is_file():
                return candidate
        return None

    def missing_files(self) -> list[str]:
        """Names (as `NAME[.gz]`) of the files that are not there, over all splits."""
        return [
            f"{name}[.gz]"
            for split in ("train", "valid", "test")
            for name in file_names(self.cfg, split)
            if self._find(name) is None
        ]

    def files(self, split: str) -> list[Path]:
        paths = [self._find(name) for name in file_names(self.cfg, split)]
        if any(path is None for path in paths):
            raise MtrainError(f"{self.directory}: missing {', '.join(self.missing_files())}")
        return paths  # type: ignore[return-value]

    def fingerprint(self, split: str) -> str:
        """Paths, sizes and mtimes of the split's files, sorted: the same in both directions."""
        parts = []
        for path in self.files(split):
            status = path.stat()
            parts.append(f"{path.resolve()}:{status.st_size}:{status.st_mtime_ns}")
        return "|".join([self.cfg.format] + sorted(parts))

    def pairs(self, split: str, stats: ReadStats) -> Iterator[Pair]:
        paths = self.files(split)
        if DataFormat(self.cfg.format).one_file_per_language:
            return self._text_pairs(paths[0], paths[1], stats)
        return self._record_pairs(paths[0], stats)

    # ------------------------------------------------------------------ reading
    def _decode(self, raw: bytes, path: Path, line_number: int, stats: ReadStats) -> str | None:
        """One line as text, or None when it is not UTF-8 and data.invalid_utf8=skip."""
        if line_number == 1 and raw.startswith(BOM):
            raw = raw[len(BOM) :]
        if b"\x00" in raw:
            stats.nul_lines += 1
            raw = raw.replace(b"\x00", b"")
        try:
            return raw.decode("utf-8").strip()
        except UnicodeDecodeError as error:
            if self.cfg.invalid_utf8 == InvalidUtf8.error:
                raise MtrainError(
                    f"{path}:{line_number}: not valid UTF-8 ({error.reason} at byte {error.start}); "
                    "fix the file, or set data.invalid_utf8=skip to skip such pairs"
                ) from error
            if stats.first_invalid is None:
                stats.first_invalid = f"{path} line {line_number}"
            return None

    def _text_pairs(self, src_path: Path, tgt_path: Path, stats: ReadStats) -> Iterator[Pair]:
        src_lines, tgt_lines = read_lines(src_path), read_lines(tgt_path)
        line_number = 0
        for raw_src, raw_tgt in zip_longest(src_lines, tgt_lines):
            line_number += 1
            if raw_src is None or raw_tgt is None:
                if raw_src is None:
                    src_count, tgt_count = line_number - 1, line_number + sum(1 for _ in tgt_lines)
                else:
                    src_count, tgt_count = line_number + sum(1 for _ in src_lines), line_number - 1
                raise MtrainError(
                    f"{src_path} has {src_count} lines but {tgt_path} has {tgt_count}; the files "
                    "of a split must be line-aligned (one sentence per line, same order)"
                )
            src = self._decode(raw_src, src_path, line_number, stats)
            tgt = self._decode(raw_tgt, tgt_path, line_number, stats)
            if src is None or tgt is None:
                stats.invalid_utf8 += 1
                continue
            stats.pairs += 1
            yield src, tgt

    def _record_pairs(self, path: Path, stats: ReadStats) -> Iterator[Pair]:
        parse = self._tsv_pair if self.cfg.format == DataFormat.tsv else self._json_pair
        for line_number, raw in enumerate(read_lines(path), start=1):
            line = self._decode(raw, path, line_number, stats)
            if line is None:
                stats.invalid_utf8 += 1
                continue
            if not line:
                continue  # a blank line holds no pair, and nothing is aligned by line here
            src, tgt = parse(line, path, line_number)
            stats.pairs += 1
            yield clean_text(src, stats), clean_text(tgt, stats)

    def _tsv_pair(self, line: str, path: Path, line_number: int) -> Pair:
        fields = line.split("\t")
        if len(fields) != 2:
            raise MtrainError(
                f"{path}:{line_number}: expected 2 tab-separated fields ({self.cfg.src}<TAB>"
                f"{self.cfg.tgt}), found {len(fields)}"
            )
        return fields[0], fields[1]

    def _json_pair(self, line: str, path: Path, line_number: int) -> Pair:
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise MtrainError(f"{path}:{line_number}: not a JSON object ({error})") from error
        if isinstance(record, dict) and isinstance(record.get("translation"), dict):
            record = record["translation"]
        if not isinstance(record, dict) or self.cfg.src not in record or self.cfg.tgt not in record:
            keys = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise MtrainError(
                f"{path}:{line_number}: expected keys '{self.cfg.src}' and '{self.cfg.tgt}' "
                f"(top level or under 'translation'), found {keys}; check data.src/data.tgt"
            )
        return str(record[self.cfg.src] or ""), str(record[self.cfg.tgt] or "")
