"""SentencePiece training, caching and the Tokenizer contract (mtrain.tokenizer)."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import pytest
import sentencepiece as spm

from mtrain.config import DataConfig, TokenizerConfig
from mtrain.errors import MtrainError
from mtrain.tokenizer import SpecialIds, Tokenizer, train_or_load_tokenizer

SMALL = dict(vocab_size=500)


@pytest.fixture
def data(multi30k_slice, tmp_path) -> DataConfig:
    return DataConfig(local_dir=str(multi30k_slice), cache_dir=str(tmp_path / "cache"))


def quiet(_message: str) -> None:
    pass


def first_sentences(multi30k_slice, lang: str, n: int = 5):
    return (multi30k_slice / f"train.{lang}").read_text(encoding="utf-8").splitlines()[:n]


def test_special_ids_encoding_and_decoding(data, multi30k_slice):
    tokenizer = train_or_load_tokenizer(TokenizerConfig(**SMALL), data, log=quiet)
    assert (tokenizer.unk_id, tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id) == (0, 1, 2, 3)
    assert tokenizer.joint and tokenizer.src_vocab_size == tokenizer.tgt_vocab_size == 500
    for sentence in first_sentences(multi30k_slice, "en"):
        ids = tokenizer.encode_tgt(sentence)
        assert tokenizer.eos_id not in ids and tokenizer.bos_id not in ids
        assert tokenizer.decode_tgt(ids) == " ".join(sentence.split())
        padded = [tokenizer.bos_id] + ids + [tokenizer.eos_id, tokenizer.pad_id, tokenizer.pad_id]
        assert tokenizer.decode_tgt(padded) == tokenizer.decode_tgt(ids)
        assert "".join(tokenizer.tgt_pieces(ids)).replace("▁", " ").strip() == " ".join(sentence.split())
    german = first_sentences(multi30k_slice, "de", 1)[0]
    assert tokenizer.src_pieces(tokenizer.encode_src(german))[0].startswith("▁")


def test_explicit_special_ids_are_honoured(data):
    cfg = TokenizerConfig(**SMALL, unk_id=3, pad_id=0, bos_id=1, eos_id=2)
    tokenizer = train_or_load_tokenizer(cfg, data, log=quiet)
    assert (tokenizer.unk_id, tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id) == (3, 0, 1, 2)
    # Handed on as one value, read back from the model file like the attributes.
    assert tokenizer.special_ids == SpecialIds(unk=3, pad=0, bos=1, eos=2)
    assert Tokenizer.load(next(iter(tokenizer.files.values())).parent).special_ids == tokenizer.special_ids
    with pytest.raises(dataclasses.FrozenInstanceError):
        tokenizer.special_ids.pad = 5


def test_save_and_load_round_trip(data, tmp_path, multi30k_slice):
    tokenizer = train_or_load_tokenizer(TokenizerConfig(**SMALL), data, log=quiet)
    tokenizer.save(tmp_path / "run" / "tokenizer")
    assert sorted(p.name for p in (tmp_path / "run" / "tokenizer").iterdir()) == ["spm.model"]
    loaded = Tokenizer.load(tmp_path / "run" / "tokenizer")
    sentence = first_sentences(multi30k_slice, "de", 1)[0]
    assert loaded.encode_src(sentence) == tokenizer.encode_src(sentence)
    assert loaded.fingerprint == tokenizer.fingerprint
    with pytest.raises(MtrainError, match="no tokenizer here"):
        Tokenizer.load(tmp_path)


def test_separate_vocabularies(data, tmp_path, multi30k_slice):
    tokenizer = train_or_load_tokenizer(TokenizerConfig(**SMALL, joint=False), data, log=quiet)
    assert not tokenizer.joint
    assert tokenizer.src_vocab_size == tokenizer.tgt_vocab_size == 500
    english = first_sentences(multi30k_slice, "en", 1)[0]
    assert tokenizer.encode_src(english) != tokenizer.encode_tgt(english)  # different vocabularies
    tokenizer.save(tmp_path / "run")
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["src.model", "tgt.model"]
    assert not Tokenizer.load(tmp_path / "run").joint


def test_second_call_reuses_the_cached_model(data, monkeypatch):
    cfg = TokenizerConfig(**SMALL)
    first = train_or_load_tokenizer(cfg, data, log=quiet)
    model_file = first.files["spm.model"]
    mtime = model_file.stat().st_mtime_ns

    def no_training(*args, **kwargs):
        raise AssertionError("the tokenizer was retrained")

    monkeypatch.setattr(spm.SentencePieceTrainer, "train", no_training)
    messages = []
    second = train_or_load_tokenizer(cfg, data, log=messages.append)
    assert second.fingerprint == first.fingerprint
    assert model_file.stat().st_mtime_ns == mtime
    assert any("reusing" in m for m in messages)
    # A joint vocabulary does not depend on the direction.
    reverse = DataConfig(local_dir=data.local_dir, cache_dir=data.cache_dir, src="en", tgt="de")
    assert train_or_load_tokenizer(cfg, reverse, log=quiet).fingerprint == first.fingerprint


@pytest.mark.parametrize(
    "change",
    [
        dict(vocab_size=400),
        dict(model_type="bpe"),
        dict(character_coverage=0.98),
        dict(max_sentences=300),
        dict(num_threads=2),
    ],
)
def test_different_settings_train_a_different_model(data, change):
    base = train_or_load_tokenizer(TokenizerConfig(**SMALL), data, log=quiet)
    other = train_or_load_tokenizer(TokenizerConfig(**{**SMALL, **change}), data, log=quiet)
    assert other.files["spm.model"].parent != base.files["spm.model"].parent
    assert other.fingerprint != base.fingerprint


def _pieces(tokenizer: Tokenizer) -> list:
    """The vocabulary a model file holds (pieces and scores; the file also names its paths)."""
    model = spm.SentencePieceProcessor(model_file=str(tokenizer.files["spm.model"]))
    return [(model.id_to_piece(i), model.get_score(i)) for i in range(model.get_piece_size())]


def test_worker_count_does_not_change_the_tokenizer(multi30k_slice, tmp_path):
    """SentencePiece's model depends on its thread count (2 threads train other pieces than 1),
    so training uses tokenizer.num_threads, never data.num_workers: `mtrain prepare
    data.num_workers=8` and a plain `mtrain fit` build the same tokenizer."""

    def trained(cache: str, workers: int = 1, **settings) -> list:
        """Pieces of a tokenizer trained in a cache of its own (never reused from another)."""
        data = DataConfig(local_dir=str(multi30k_slice), cache_dir=str(tmp_path / cache), num_workers=workers)
        return _pieces(train_or_load_tokenizer(TokenizerConfig(**SMALL, **settings), data, log=quiet))

    one_worker = trained("one_worker")
    assert trained("two_workers", workers=2) == one_worker
    assert trained("two_threads", num_threads=2) != one_worker  # why the count is a setting (and part of the key)


def test_changed_training_data_trains_a_new_model(data, tmp_path, multi30k_slice):
    copy = tmp_path / "copy"
    shutil.copytree(multi30k_slice, copy)
    data.local_dir = str(copy)
    before = train_or_load_tokenizer(TokenizerConfig(**SMALL), data, log=quiet)
    with open(copy / "train.de", "a", encoding="utf-8") as f, open(copy / "train.en", "a", encoding="utf-8") as g:
        f.write("Ein neuer Satz.\n")
        g.write("A new sentence.\n")
    os.utime(copy / "train.de", ns=(0, 10**18))
    after = train_or_load_tokenizer(TokenizerConfig(**SMALL), data, log=quiet)
    assert after.files["spm.model"].parent != before.files["spm.model"].parent


def test_bad_tokenizer_settings(data):
    with pytest.raises(MtrainError, match="lower tokenizer.vocab_size"):
        train_or_load_tokenizer(TokenizerConfig(vocab_size=60000), data, log=quiet)
    with pytest.raises(MtrainError, match="tokenizer.model_type=word"):
        train_or_load_tokenizer(TokenizerConfig(model_type="word"), data, log=quiet)
    with pytest.raises(MtrainError, match="four distinct"):
        train_or_load_tokenizer(TokenizerConfig(pad_id=0), data, log=quiet)
    assert not list((Path(data.cache_dir) / "tokenizers").glob("*tmp*")), "failed builds left staging dirs"


def test_sentencepiece_failures_get_the_hint_of_their_cause():
    from mtrain.tokenizer.training import sentencepiece_hint

    too_high = (
        "INTERNAL: src/trainer_interface.cc(744) [(trainer_spec_.vocab_size()) == "
        "(model_proto->pieces_size())] Vocabulary size too high (1000). Please set it to a value <= 12."
    )
    assert "lower tokenizer.vocab_size to at most 12" in sentencepiece_hint(too_high)
    too_small = "Vocabulary size is smaller than required_chars. 600 vs 3000. Increase vocab_size or decrease character_coverage"
    assert "raise tokenizer.vocab_size" in sentencepiece_hint(too_small)
    no_lines = "INTERNAL: src/trainer_interface.cc(467) [!sentences_.empty()]"
    assert "CR-only line ends" in sentencepiece_hint(no_lines) and "vocab_size" not in sentencepiece_hint(no_lines)


@pytest.mark.parametrize("joint", [True, False])
def test_the_model_file_does_not_depend_on_where_it_was_trained(multi30k_slice, tmp_path, joint):
    """Two builds of one tokenizer in other cache directories write byte-identical files, so
    its fingerprint (and every encoded-corpus cache key made from it) is the same on every machine."""
    built = []
    for cache in ("first_machine", "second/machine"):
        data = DataConfig(local_dir=str(multi30k_slice), cache_dir=str(tmp_path / cache))
        built.append(train_or_load_tokenizer(TokenizerConfig(**SMALL, joint=joint), data, log=quiet))
    first, second = built
    assert first.files != second.files  # two real builds, not a cache hit
    for name in first.files:
        assert first.files[name].read_bytes() == second.files[name].read_bytes(), name
        assert str(tmp_path) not in first.files[name].read_bytes().decode("latin-1"), name
    assert first.fingerprint == second.fingerprint
