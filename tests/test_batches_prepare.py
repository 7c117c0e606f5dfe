"""prepare_data end to end, the Hub path against local files, `mtrain prepare`, the presets."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from mtrain.batches.encoding import ChunkEncoder
from mtrain.batches.prepare import prepare_data
from mtrain.config import DataConfig, TokenizerConfig
from tests.prepared_data import same_arrays, silent
from tests.warm_process import run_mtrain

REPO = Path(__file__).resolve().parents[1]
TOKENIZER = TokenizerConfig(vocab_size=600)


def slice_config(multi30k_slice: Path, cache: Path, **overrides) -> DataConfig:
    return DataConfig(local_dir=str(multi30k_slice), cache_dir=str(cache), **overrides)


def lines(path: Path):
    return path.read_text(encoding="utf-8").splitlines()


def test_prepare_encodes_every_split_and_reports_counts(multi30k_slice, tmp_path):
    messages = []
    prepared = prepare_data(slice_config(multi30k_slice, tmp_path), TOKENIZER, log=messages.append)
    tokenizer = prepared.tokenizer
    assert (len(prepared.train), len(prepared.valid), len(prepared.test)) == (2000, 100, 100)
    assert prepared.train.src_tokens.dtype == np.uint16
    # Sources end with eos, targets are stored bare; the text decodes back.
    german, english = lines(multi30k_slice / "train.de"), lines(multi30k_slice / "train.en")
    for i in (0, 1, 1999):
        assert prepared.train.src(i)[-1] == tokenizer.eos_id
        assert prepared.train.src(i)[:-1].tolist() == tokenizer.encode_src(german[i])
        assert prepared.train.tgt(i).tolist() == tokenizer.encode_tgt(english[i])
    assert prepared.valid_text.src == lines(multi30k_slice / "val.de")
    assert prepared.test_text.tgt == lines(multi30k_slice / "test_2016_flickr.en")
    report = "\n".join(messages)
    assert "data: train: 2,000 pairs read" in report and "kept" in report
    assert "tokens: src" in report and "encoded in" in report


def test_second_run_is_a_cache_hit_without_encoding(multi30k_slice, tmp_path, monkeypatch):
    first = prepare_data(slice_config(multi30k_slice, tmp_path), TOKENIZER, log=silent)

    def no_encoding(self, pairs):
        raise AssertionError("the corpus was encoded again")

    monkeypatch.setattr(ChunkEncoder, "__call__", no_encoding)
    messages = []
    second = prepare_data(slice_config(multi30k_slice, tmp_path), TOKENIZER, log=messages.append)
    assert any("cache hit" in m for m in messages) and any("tokenizer: reusing" in m for m in messages)
    assert second.directory == first.directory and same_arrays(first.train, second.train)
    assert second.valid_text == first.valid_text
    # Settings that change the arrays give another entry.
    monkeypatch.undo()
    limited = prepare_data(slice_config(multi30k_slice, tmp_path, train_limit=500), TOKENIZER, log=silent)
    assert len(limited.train) == 500 and limited.directory != first.directory
    other_direction = prepare_data(slice_config(multi30k_slice, tmp_path, src="en", tgt="de"), TOKENIZER, log=silent)
    assert other_direction.directory != first.directory
    assert other_direction.tokenizer.fingerprint == first.tokenizer.fingerprint  # joint: shared


def test_worker_processes_give_the_same_arrays(multi30k_slice, tmp_path):
    single = prepare_data(slice_config(multi30k_slice, tmp_path, chunk_size=300), TOKENIZER, log=silent)
    shutil.rmtree(single.directory)  # keep the tokenizer, rebuild the corpus with workers
    messages = []
    parallel = prepare_data(
        slice_config(multi30k_slice, tmp_path, chunk_size=300, num_workers=2), TOKENIZER, log=messages.append
    )
    assert not any("cache hit" in m for m in messages)
    for split in ("train", "valid", "test"):
        assert same_arrays(getattr(single, split), getattr(parallel, split)), split


def test_hub_path_gives_the_same_arrays_as_local_files(multi30k_slice, tmp_path, monkeypatch):
    """A local parquet dataset with wmt14's schema, read through the Hub code path."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")
    monkeypatch.delenv("MTRAIN_DATA_DIR", raising=False)
    hub_dir = tmp_path / "wmt_like"
    hub_dir.mkdir()
    for ours, theirs in (("train", "train"), ("val", "validation"), ("test_2016_flickr", "test")):
        de, en = lines(multi30k_slice / f"{ours}.de"), lines(multi30k_slice / f"{ours}.en")
        rows = [{"de": d, "en": e} for d, e in zip(de, en, strict=True)]
        datasets.Dataset.from_dict({"translation": rows}).to_parquet(str(hub_dir / f"{theirs}.parquet"))

    local = prepare_data(slice_config(multi30k_slice, tmp_path / "local_cache"), TOKENIZER, log=silent)
    hub_cfg = DataConfig(name="wmt_like", cache_dir=str(tmp_path / "hub_cache"))
    hub_cfg.hub.id, hub_cfg.hub.config = str(hub_dir), None
    messages = []
    from_hub = prepare_data(hub_cfg, TOKENIZER, log=messages.append)
    assert "Hugging Face dataset" in messages[0]
    for split in ("train", "valid", "test"):
        assert same_arrays(getattr(local, split), getattr(from_hub, split)), split
    assert from_hub.valid_text == local.valid_text and from_hub.test_text == local.test_text


# ------------------------------------------------------------------ the CLI and the presets
def run_cli(*overrides: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("MTRAIN_DATA_DIR", None)
    return run_mtrain("prepare", *overrides, cwd=cwd, env=env, text=True, timeout=300)


def test_mtrain_prepare_command(multi30k_slice, tmp_path):
    args = [f"data.local_dir={multi30k_slice}", f"data.cache_dir={tmp_path / 'cache'}", "tokenizer.vocab_size=600"]
    first = run_cli(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "data: train: 2,000 pairs read" in first.stdout and "prepared:" in first.stdout
    second = run_cli(*args, cwd=tmp_path)
    assert second.returncode == 0 and "cache hit" in second.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]  # no run dir, no log file

    missing = run_cli("data.local_dir=/no/such/dir", f"data.cache_dir={tmp_path / 'cache'}", cwd=tmp_path)
    assert missing.returncode == 2
    error_lines = [line for line in missing.stderr.splitlines() if line.strip()]
    assert error_lines == [error_lines[-1]] and error_lines[0].startswith("mtrain: error: data.local_dir=/no/such/dir")
    assert "train.de[.gz]" in error_lines[0]


PRESETS = sorted(p.stem for p in (REPO / "configs" / "data").glob("*.yaml"))


@pytest.fixture
def compose():
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from mtrain.cli.common import CONFIG_DIR

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        yield lambda overrides: hydra_compose(config_name="prepare", overrides=overrides)
    GlobalHydra.instance().clear()


@pytest.mark.parametrize("preset", PRESETS)
def test_every_data_preset_composes_in_both_directions(compose, preset):
    cfg = compose([f"data={preset}"])
    assert cfg.data.name == preset and cfg.data.hub.id
    assert cfg.data.src != cfg.data.tgt and cfg.tokenizer.vocab_size == 8000
    swapped = compose([f"data={preset}", f"data.src={cfg.data.tgt}", f"data.tgt={cfg.data.src}"])
    assert (swapped.data.src, swapped.data.tgt) == (cfg.data.tgt, cfg.data.src)


def test_presets_name_their_splits_and_test_sets(compose):
    assert set(PRESETS) >= {"multi30k", "iwslt14_de_en", "iwslt17_de_en", "wmt14_en_de", "wmt16_en_ro"}
    wmt14 = compose(["data=wmt14_en_de", "tokenizer=spm32k_bpe"]).data
    assert (wmt14.hub.id, wmt14.hub.config, wmt14.splits.test) == ("wmt/wmt14", "de-en", "newstest2014")
    assert wmt14.splits.valid == "newstest2013"  # as in ../shared/data/wmt14_en_de
    multi30k = compose(["data=multi30k"]).data
    assert (multi30k.splits.train, multi30k.splits.valid, multi30k.splits.test) == ("train", "val", "test_2016_flickr")
    with pytest.raises(Exception, match="not_a_key"):
        compose(["data=multi30k", "data.not_a_key=1"])


def test_wmt14_preset_reads_the_shared_newstest2013(compose, data_dir, monkeypatch):
    """The preset's local layout matches ../shared/data/wmt14_en_de (which lacks train)."""
    from mtrain.data.local_files import LocalSource
    from mtrain.data.sources import ReadStats

    cfg = compose(["data=wmt14_en_de"]).data
    source = LocalSource(data_dir / "wmt14_en_de", cfg)
    assert source.missing_files() == ["train.en[.gz]", "train.de[.gz]", "newstest2014.en[.gz]", "newstest2014.de[.gz]"]
    assert len(list(source.pairs("valid", ReadStats()))) == 3000
