"""Corpus sources (mtrain.data.sources, local_files, hub): formats, resolution, bad input."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from mtrain.config import DataConfig
from mtrain.data import hub
from mtrain.data.sources import ReadStats, resolve_source
from mtrain.errors import MtrainError

PAIRS = [("Ein Hund läuft.", "A dog runs."), ("Zwei Männer.", "Two men."), ("Ja", "Yes")]


def config(directory: Path, **overrides) -> DataConfig:
    cfg = DataConfig(local_dir=str(directory), **overrides)
    cfg.splits.test = "test"
    return cfg


def write_text_corpus(directory: Path, pairs=PAIRS, compress=False) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for split in ("train", "val", "test"):
        for side, lang in ((0, "de"), (1, "en")):
            data = "".join(p[side] + "\n" for p in pairs).encode("utf-8")
            if compress:
                (directory / f"{split}.{lang}.gz").write_bytes(gzip.compress(data))
            else:
                (directory / f"{split}.{lang}").write_bytes(data)
    return directory


def read(cfg: DataConfig, split: str = "train"):
    stats = ReadStats()
    return list(resolve_source(cfg).pairs(split, stats)), stats


# ------------------------------------------------------------------ local files
def test_plain_and_gzip_text_give_the_same_pairs(tmp_path):
    plain = write_text_corpus(tmp_path / "plain")
    packed = write_text_corpus(tmp_path / "packed", compress=True)
    assert read(config(plain))[0] == PAIRS
    assert read(config(packed))[0] == PAIRS
    assert read(config(plain, src="en", tgt="de"))[0] == [(en, de) for de, en in PAIRS]


def test_crlf_bom_and_nul_bytes_are_repaired(tmp_path):
    directory = write_text_corpus(tmp_path / "d")
    (directory / "train.de").write_bytes(b"\xef\xbb\xbfEin Hund.\r\nZwei\x00 M\xc3\xa4nner.\r\n")
    (directory / "train.en").write_bytes(b"A dog.\r\nTwo men.\r\n")
    pairs, stats = read(config(directory))
    assert pairs == [("Ein Hund.", "A dog."), ("Zwei Männer.", "Two men.")]
    assert stats.nul_lines == 1


def test_tsv_and_jsonl_formats(tmp_path):
    directory = tmp_path / "records"
    directory.mkdir()
    for split in ("train", "val", "test"):
        (directory / f"{split}.tsv").write_text("".join(f"{de}\t{en}\n" for de, en in PAIRS) + "\n", encoding="utf-8")
        lines = [
            json.dumps({"de": PAIRS[0][0], "en": PAIRS[0][1], "id": 1}),
            json.dumps({"translation": {"de": PAIRS[1][0], "en": PAIRS[1][1]}}),
        ]
        (directory / f"{split}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert read(config(directory, format="tsv", pattern="{split}.tsv"))[0] == PAIRS
    assert read(config(directory, format="jsonl", pattern="{split}.jsonl"))[0] == PAIRS[:2]
    reverse = config(directory, format="jsonl", pattern="{split}.jsonl", src="en", tgt="de")
    assert read(reverse)[0][0] == (PAIRS[0][1], PAIRS[0][0])


def test_malformed_records_name_file_and_line(tmp_path):
    directory = tmp_path / "records"
    directory.mkdir()
    for split in ("train", "val", "test"):
        (directory / f"{split}.tsv").write_text("a\tb\nonly one field\n", encoding="utf-8")
        (directory / f"{split}.jsonl").write_text('{"de": "a", "fr": "b"}\n', encoding="utf-8")
    with pytest.raises(MtrainError, match=r"train\.tsv:2: expected 2 tab-separated fields"):
        read(config(directory, format="tsv", pattern="{split}.tsv"))
    with pytest.raises(MtrainError, match=r"train\.jsonl:1: expected keys 'de' and 'en'.*\['de', 'fr'\]"):
        read(config(directory, format="jsonl", pattern="{split}.jsonl"))
    with pytest.raises(MtrainError, match=r"data\.pattern.*must not contain a \{lang\}"):
        read(config(directory, format="tsv"))


def test_mismatched_line_counts_name_both_files_and_counts(tmp_path):
    directory = write_text_corpus(tmp_path / "d")
    (directory / "train.en").write_text("A dog runs.\nTwo men.\n", encoding="utf-8")
    with pytest.raises(MtrainError) as error:
        read(config(directory))
    message = str(error.value)
    assert "train.de has 3 lines" in message and "train.en has 2" in message
    (directory / "train.en").write_text("a\nb\nc\nd\ne\n", encoding="utf-8")
    with pytest.raises(MtrainError, match=r"train\.de has 3 lines but .*train\.en has 5"):
        read(config(directory))


def test_invalid_utf8_is_skipped_and_counted_or_fatal(tmp_path):
    directory = write_text_corpus(tmp_path / "d")
    (directory / "train.de").write_bytes(b"Ein Hund.\nkaputt \xff\xfe\nJa\nnoch \xc3\n")
    (directory / "train.en").write_bytes(b"A dog.\nbroken\nYes\nagain\n")
    pairs, stats = read(config(directory))
    assert pairs == [("Ein Hund.", "A dog."), ("Ja", "Yes")]
    assert stats.invalid_utf8 == 2 and stats.first_invalid.endswith("train.de line 2")
    messages = []
    stats.report("train", messages.append)
    assert "skipped 2 pairs" in messages[0] and "train.de line 2" in messages[0]
    with pytest.raises(MtrainError, match=r"train\.de:2: not valid UTF-8.*data\.invalid_utf8=skip"):
        read(config(directory, invalid_utf8="error"))


def test_corrupted_gzip_is_a_clear_error(tmp_path):
    directory = write_text_corpus(tmp_path / "d", pairs=PAIRS * 500, compress=True)
    packed = (directory / "train.en.gz").read_bytes()
    (directory / "train.en.gz").write_bytes(packed[: len(packed) // 2])  # truncated download
    with pytest.raises(MtrainError, match=r"train\.en\.gz: unreadable after line \d+.*corrupted or truncated"):
        read(config(directory))
    (directory / "train.en.gz").write_bytes(b"not gzip at all\n")
    with pytest.raises(MtrainError, match=r"train\.en\.gz: unreadable after line 0"):
        read(config(directory))


# ------------------------------------------------------------------ resolution
def test_missing_local_files_list_what_was_looked_for(tmp_path):
    directory = write_text_corpus(tmp_path / "d")
    (directory / "val.en").unlink()
    with pytest.raises(MtrainError) as error:
        resolve_source(config(directory))
    message = str(error.value)
    assert "data.local_dir=" in message and "val.en[.gz]" in message and "val.de" not in message


def test_resolution_uses_mtrain_data_dir_then_reports_every_attempt(tmp_path, monkeypatch):
    write_text_corpus(tmp_path / "store" / "mycorpus")
    monkeypatch.setenv("MTRAIN_DATA_DIR", str(tmp_path / "store"))
    cfg = DataConfig(name="mycorpus")
    cfg.splits.test = "test"
    assert str(tmp_path / "store" / "mycorpus") in resolve_source(cfg).description

    cfg.name = "absent"
    cfg.hub.id = None
    with pytest.raises(MtrainError) as error:
        resolve_source(cfg)
    message = str(error.value)
    assert "data.local_dir is not set" in message
    assert f"$MTRAIN_DATA_DIR/absent = {tmp_path / 'store' / 'absent'} does not exist" in message
    assert "data.hub.id is not set" in message and "Set data.local_dir=DIR" in message

    monkeypatch.delenv("MTRAIN_DATA_DIR")
    with pytest.raises(MtrainError, match=r"\$MTRAIN_DATA_DIR is not set"):
        resolve_source(cfg)


def test_bad_data_settings_are_rejected():
    with pytest.raises(MtrainError, match="data.src and data.tgt"):
        resolve_source(DataConfig(src="de", tgt="de"))
    with pytest.raises(MtrainError, match="data.format=xml"):
        resolve_source(DataConfig(format="xml"))
    with pytest.raises(MtrainError, match="data.invalid_utf8=drop"):
        resolve_source(DataConfig(invalid_utf8="drop"))


# ------------------------------------------------------------------ Hugging Face datasets
def write_parquet_dataset(directory: Path, columns: dict) -> Path:
    """A local dataset with train/validation/test parquet files (how the Hub stores wmt14)."""
    import datasets

    directory.mkdir(parents=True)
    for split in ("train", "validation", "test"):
        datasets.Dataset.from_dict(columns).to_parquet(str(directory / f"{split}.parquet"))
    return directory


def hub_config(dataset: Path, **hub_overrides) -> DataConfig:
    cfg = DataConfig(name="none-such-local-copy")
    cfg.hub.id = str(dataset)
    cfg.hub.config = None
    for key, value in hub_overrides.items():
        setattr(cfg.hub, key, value)
    return cfg


@pytest.fixture
def no_data_dir(monkeypatch, tmp_path):
    """No local corpus to fall back on; `datasets` caches under tmp_path, not ~/.cache."""
    import datasets

    monkeypatch.delenv("MTRAIN_DATA_DIR", raising=False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")


def test_hub_translation_dicts_and_per_language_columns(tmp_path, no_data_dir):
    wmt_like = write_parquet_dataset(tmp_path / "wmt", {"translation": [{"de": d, "en": e} for d, e in PAIRS]})
    source = resolve_source(hub_config(wmt_like))
    assert "Hugging Face dataset" in source.description
    assert list(source.pairs("valid", ReadStats())) == PAIRS
    reverse = hub_config(wmt_like)
    reverse.src, reverse.tgt = "en", "de"
    assert list(resolve_source(reverse).pairs("train", ReadStats()))[1] == (PAIRS[1][1], PAIRS[1][0])

    columns = write_parquet_dataset(tmp_path / "cols", {"de": [d for d, _ in PAIRS], "english": [e for _, e in PAIRS]})
    cfg = hub_config(columns, translation_field=None, tgt_field="english")
    assert list(resolve_source(cfg).pairs("test", ReadStats())) == PAIRS


def test_hub_field_mapping_errors_list_the_columns(tmp_path, no_data_dir):
    dataset = write_parquet_dataset(
        tmp_path / "ds", {"translation": [{"de": d, "en": e} for d, e in PAIRS], "id": [1, 2, 3]}
    )
    with pytest.raises(MtrainError, match=r"translation_field='pairs' is not a column.*\['translation', 'id'\]"):
        list(resolve_source(hub_config(dataset, translation_field="pairs")).pairs("train", ReadStats()))
    with pytest.raises(MtrainError, match=r"no column 'de' \(data\.hub\.src_field\).*\['translation', 'id'\]"):
        list(resolve_source(hub_config(dataset, translation_field=None)).pairs("train", ReadStats()))
    french = hub_config(dataset)
    french.tgt = "fr"
    with pytest.raises(MtrainError, match=r"has languages \['de', 'en'\], not \['fr'\]"):
        list(resolve_source(french).pairs("train", ReadStats()))


def test_hub_unknown_config_or_split_is_a_clear_error(tmp_path, no_data_dir):
    dataset = write_parquet_dataset(tmp_path / "ds", {"translation": [{"de": d, "en": e} for d, e in PAIRS]})
    with pytest.raises(MtrainError, match=r"config fr-en.*'fr-en' not found.*fix data\.hub\.config"):
        list(resolve_source(hub_config(dataset, config="fr-en")).pairs("train", ReadStats()))
    bad_split = hub_config(dataset, splits={"train": "train", "valid": "dev", "test": "test"})
    with pytest.raises(MtrainError, match=r"split dev.*data\.hub\.splits\.valid"):
        list(resolve_source(bad_split).pairs("valid", ReadStats()))


def write_parquet_export(directory: Path, config: str, splits: dict) -> Path:
    """A dataset laid out as the Hub's parquet export (refs/convert/parquet) lays it out:
    <config>/<split>/0000.parquet, or <config>/partial-<split>/ for a split cut short."""
    import datasets

    for folder, pairs in splits.items():
        (directory / config / folder).mkdir(parents=True)
        rows = {"translation": [{"de": d, "en": e} for d, e in pairs]}
        datasets.Dataset.from_dict(rows).to_parquet(str(directory / config / folder / "0000.parquet"))
    return directory


def test_a_script_dataset_is_read_from_its_parquet_export(tmp_path, no_data_dir, caplog):
    # As on the Hub: a loading script, which `datasets` >= 4 refuses, beside the export.
    dataset = write_parquet_export(
        tmp_path / "iwslt_like", "iwslt2017-de-en", {"train": PAIRS, "validation": PAIRS[:2], "partial-test": PAIRS[2:]}
    )
    (dataset / "iwslt_like.py").write_text("import datasets\n", encoding="utf-8")
    cfg = hub_config(dataset, config="iwslt2017-de-en")
    with caplog.at_level("WARNING", logger="mtrain"):
        assert list(resolve_source(cfg).pairs("train", ReadStats())) == PAIRS
    assert "built by a loading script" in caplog.text and "parquet export" in caplog.text
    assert list(resolve_source(cfg).pairs("valid", ReadStats())) == PAIRS[:2]
    with caplog.at_level("WARNING", logger="mtrain"):
        assert list(resolve_source(cfg).pairs("test", ReadStats())) == PAIRS[2:]
    assert "only the first part of split test" in caplog.text


def test_hub_revision_parquet_export_reads_it_directly(tmp_path, no_data_dir, caplog):
    dataset = write_parquet_export(tmp_path / "export", "default", {"train": PAIRS})
    cfg = hub_config(dataset, revision="refs/convert/parquet")
    with caplog.at_level("WARNING", logger="mtrain"):
        assert list(resolve_source(cfg).pairs("train", ReadStats())) == PAIRS
    assert "loading script" not in caplog.text
    with pytest.raises(MtrainError, match=r"revision refs/convert/parquet.*no default/validation/ folder"):
        list(resolve_source(cfg).pairs("valid", ReadStats()))


def test_unreachable_hub_names_the_dataset_and_the_local_alternatives(monkeypatch, no_data_dir):
    def offline(dataset_id, config, split, revision=None):
        raise ConnectionError(f"Couldn't reach '{dataset_id}' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(hub, "load_hub_split", offline)
    cfg = DataConfig(name="wmt14_en_de", src="en", tgt="de")
    cfg.hub.id, cfg.hub.config = "wmt/wmt14", "de-en"
    source = resolve_source(cfg)
    with pytest.raises(MtrainError) as error:
        list(source.pairs("train", ReadStats()))
    message = str(error.value)
    assert "data.hub.id=wmt/wmt14 (config de-en, split train)" in message
    assert "cannot be reached" in message and "$MTRAIN_DATA_DIR is not set" in message
    assert "data.local_dir=DIR" in message and "HF_HUB_OFFLINE=1" in message


def test_a_language_the_local_copy_lacks_fails_at_once_instead_of_asking_the_hub(tmp_path, monkeypatch):
    """`data.src=xx` with the corpus in $MTRAIN_DATA_DIR in de/en only: a mistyped code, said
    in one line before the Hub is tried (offline it retried for half a minute)."""

    def hub_asked(*args, **kwargs):
        raise AssertionError("the Hub was asked")

    monkeypatch.setattr(hub, "load_hub_split", hub_asked)
    write_text_corpus(tmp_path / "store" / "mycorpus")
    monkeypatch.setenv("MTRAIN_DATA_DIR", str(tmp_path / "store"))
    cfg = DataConfig(name="mycorpus", src="xx")
    cfg.splits.test = "test"
    cfg.hub.id = "someone/mycorpus"
    with pytest.raises(
        MtrainError,
        match=r"^data.src=xx: the local copy of data=mycorpus .* has the languages "
        r"de, en only; check the language code",
    ):
        resolve_source(cfg)
    # A split missing in every language is no language mistake: the Hub is next, as before.
    (tmp_path / "store" / "mycorpus" / "test.de").unlink()
    (tmp_path / "store" / "mycorpus" / "test.en").unlink()
    cfg.src = "de"
    assert "Hugging Face dataset someone/mycorpus" in resolve_source(cfg).description


def test_a_library_warning_reaches_the_console_once(monkeypatch):
    """`datasets` and `huggingface_hub` log through a console handler of their own and also
    to the root logger's (Hydra's): each Hub retry was printed twice."""
    import io
    import logging

    from mtrain.data.hub import OWN_CONSOLE_LOGGERS, print_library_warnings_once

    root_stream = io.StringIO()
    root_handler = logging.StreamHandler(root_stream)
    logging.getLogger().addHandler(root_handler)
    try:
        for name in OWN_CONSOLE_LOGGERS:
            library = logging.getLogger(name)
            monkeypatch.setattr(library, "propagate", True)  # as the library sets it up; restored after
            own_stream = io.StringIO()
            monkeypatch.setattr(library.handlers[0], "stream", own_stream)
            library.warning("Retrying in 4s [Retry 3/5].")
            assert "Retrying" in root_stream.getvalue()  # before: twice, on two handlers
            root_stream.truncate(0)
            root_stream.seek(0)
            print_library_warnings_once()
            library.warning("Retrying in 8s [Retry 4/5].")
            assert own_stream.getvalue().count("Retry 4/5") == 1 and "Retry 4/5" not in root_stream.getvalue()
    finally:
        logging.getLogger().removeHandler(root_handler)
