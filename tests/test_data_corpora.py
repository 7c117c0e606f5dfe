"""data.corpora's data layer: per-corpus and per-split cache entries, tags at the start of
sources only, train–test overlap counted (and dropped) exactly, the provenance of `mtrain
translate` output, and every bad corpus/tag/direction refused in one line.

On a small synthetic corpus aligned in three languages (de, en, fr), so each direction has
its validation and test sets, with a tokenizer of a few dozen pieces.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import random
import subprocess
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from mtrain.batches.prepare import prepare_data
from mtrain.config import CorpusConfig, DataConfig, FitConfig, TokenizerConfig, check_corpora
from mtrain.data.provenance import provenance_path, write_provenance
from mtrain.errors import MtrainError
from tests.warm_process import run_mtrain

REPO = Path(__file__).resolve().parents[1]
WORDS = {
    "de": ["der", "Hund", "die", "Katze", "läuft", "schnell", "über", "Straße", "ein", "Haus"],
    "en": ["the", "dog", "a", "cat", "runs", "fast", "over", "street", "one", "house"],
    "fr": ["le", "chien", "la", "chatte", "court", "vite", "sur", "rue", "une", "maison"],
}
TOKENIZER = TokenizerConfig(vocab_size=40)
SIZES = {"train": 120, "val": 12, "test": 12}


def meanings(count: int, seed: int) -> list:
    rng = random.Random(seed)
    return [[rng.randrange(10) for _ in range(rng.randint(2, 6))] for _ in range(count)]


def write_split(directory: Path, name: str, rows: list, langs=("de", "en", "fr")) -> None:
    for lang in langs:
        text = "".join(" ".join(WORDS[lang][i] for i in row) + "\n" for row in rows)
        (directory / f"{name}.{lang}").write_text(text, encoding="utf-8")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """train/val/test in de, en, fr, every sentence distinct from the others' splits."""
    directory = tmp_path_factory.mktemp("tri")
    rows = meanings(SIZES["train"] + SIZES["val"] + SIZES["test"], 0)
    unique = list({tuple(row): row for row in rows}.values())
    cut = [SIZES["train"], SIZES["train"] + SIZES["val"]]
    splits = {"train": unique[: cut[0]], "val": unique[cut[0] : cut[1]], "test": unique[cut[1] :]}
    for name, split_rows in splits.items():
        write_split(directory, name, split_rows)
    return directory


def data_config(directory: Path, cache: Path, **values) -> DataConfig:
    cfg = DataConfig(**{"name": "tri", **values}, local_dir=str(directory), cache_dir=str(cache))
    cfg.splits.test = "test"
    cfg.clean.max_len_ratio = 100.0  # a tiny vocabulary: token counts of the languages differ a lot
    return cfg


def prepare(cfg: DataConfig, **options):
    messages: list = []
    return prepare_data(cfg, TOKENIZER, log=messages.append, **options), "\n".join(messages)


def lines(path: Path) -> list:
    return path.read_text(encoding="utf-8").splitlines()


# ----------------------------------------------------------------------------- the cache
def test_changing_the_test_split_reuses_the_encoded_training_corpus(corpus, tmp_path):
    first, _ = prepare(data_config(corpus, tmp_path))
    without_test = data_config(corpus, tmp_path)
    without_test.splits.test = None
    second, log = prepare(without_test)
    assert "cache hit, reusing the encoded corpus" in log and "tokenizer: reusing" in log
    assert second.directory == first.directory and second.test is None and len(second.valid) == SIZES["val"]
    # Other data all the same: a resume compares the fingerprint and must refuse it.
    assert second.fingerprint != first.fingerprint


def test_adding_a_corpus_encodes_only_the_new_one(corpus, tmp_path):
    reverse = CorpusConfig(src="en", tgt="de")
    first, _ = prepare(data_config(corpus, tmp_path, corpora=[CorpusConfig()]))
    # The tokenizer is fixed (a parent run's, or one given): only the added corpus is encoded.
    second, log = prepare(data_config(corpus, tmp_path, corpora=[CorpusConfig(), reverse]), tokenizer=first.tokenizer)
    assert log.count("cache hit, reusing the encoded corpus") == 1 and log.count("encoded in") == 1
    assert second.train_parts[0].corpus.directory == first.train_parts[0].corpus.directory
    assert [part.name for part in second.train_parts] == ["tri.de-en", "tri.en-de"]
    assert second.fingerprint != first.fingerprint  # adding a corpus is other data
    # Without a given tokenizer the joint vocabulary is trained on both corpora: a new one.
    third, log = prepare(data_config(corpus, tmp_path, corpora=[CorpusConfig(), reverse]))
    assert third.tokenizer.fingerprint != first.tokenizer.fingerprint and "cache hit" not in log


def test_a_given_tokenizer_path_fixes_the_vocabulary_so_only_an_added_corpus_is_encoded(corpus, tmp_path):
    """tokenizer.path (fairseq's --srcdict): a run directory or a tokenizer folder; with it the
    joint vocabulary is not retrained on the added corpus, so the first corpus's entry is reused."""
    reverse = CorpusConfig(src="en", tgt="de")
    first, _ = prepare(data_config(corpus, tmp_path, corpora=[CorpusConfig()]))
    run_dir = tmp_path / "first_run"
    first.tokenizer.save(run_dir / "tokenizer")  # as `mtrain fit` leaves it in a run directory
    given = dataclasses.replace(TOKENIZER, path=str(run_dir), vocab_size=999)  # the files' settings rule
    messages: list = []
    second = prepare_data(data_config(corpus, tmp_path, corpora=[CorpusConfig(), reverse]), given, log=messages.append)
    log = "\n".join(messages)
    assert "tokenizer.path; nothing trained" in log and "tokenizer: trained" not in log
    assert second.tokenizer.fingerprint == first.tokenizer.fingerprint
    assert log.count("cache hit, reusing the encoded corpus") == 1 and log.count("encoded in") == 1
    assert second.train_parts[0].corpus.directory == first.train_parts[0].corpus.directory

    with pytest.raises(MtrainError) as error:  # a folder that holds no tokenizer
        prepare_data(data_config(corpus, tmp_path), dataclasses.replace(TOKENIZER, path=str(corpus)), log=print)
    assert str(error.value).startswith(f"tokenizer.path={corpus}: {corpus}: no tokenizer here")
    # A tag the given vocabulary lacks is refused, naming the corpus's key.
    with pytest.raises(MtrainError, match=r"data.corpora\[1\].tag: the tokenizer has no piece <bt>"):
        prepare_data(data_config(corpus, tmp_path, corpora=[CorpusConfig(), CorpusConfig(tag="bt")]), given, log=print)


@pytest.mark.parametrize(
    "values, message",
    [
        ({"tokenizer.path": "/nonexistent/run"}, "tokenizer.path: '/nonexistent/run': no such directory"),
        (
            {"tokenizer.path": ".", "init_from": "."},
            "tokenizer.path=.: a fine-tune encodes with its parent's tokenizer",
        ),
    ],
)
def test_a_tokenizer_path_that_cannot_be_used_is_refused_before_any_work(values, message):
    from mtrain.config_checks import check_config

    with pytest.raises(MtrainError) as error:
        check_config(fit_config(**values))
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


# ----------------------------------------------------------------------------- tags
def test_tags_start_every_source_of_their_corpus_and_never_a_target(corpus, tmp_path):
    corpora = [
        CorpusConfig(src="de", tgt="en"),
        CorpusConfig(src="en", tgt="de"),
        CorpusConfig(src="fr", tgt="en", tag="bt", weight=0.5),
    ]
    data, _ = prepare(data_config(corpus, tmp_path, corpora=corpora, lang_tags=True))
    tok = data.tokenizer
    ids = {symbol: tok.piece_id(symbol) for symbol in ("<2en>", "<2de>", "<bt>")}
    assert tok.unk_id not in ids.values() and len(set(ids.values())) == 3
    expected = {("de", "en"): [ids["<2en>"]], ("en", "de"): [ids["<2de>"]], ("fr", "en"): [ids["<2en>"], ids["<bt>"]]}
    for part in data.train_parts:
        prefix = expected[(part.src, part.tgt)]
        assert len(part.corpus) == SIZES["train"]
        for i in range(len(part.corpus)):
            source = part.corpus.src(i).tolist()
            assert source[: len(prefix)] == prefix and not set(ids.values()) & set(source[len(prefix) :])
            assert source[-1] == tok.eos_id
        assert not set(ids.values()) & set(np.unique(np.asarray(part.corpus.tgt_tokens)).tolist())
    assert (data.train_parts[2].weight, data.train_parts[2].tag) == (0.5, "bt")
    # One pair of evaluation sets per direction, sources with the language tag, raw text untouched.
    assert [d.name for d in data.directions] == ["de-en", "en-de", "fr-en"]
    for direction in data.directions:
        assert direction.tag_ids == [ids[f"<2{direction.tgt}>"]]
        assert direction.valid_text.src == lines(corpus / f"val.{direction.src}")
        assert direction.test_text.tgt == lines(corpus / f"test.{direction.tgt}")
        for split in (direction.valid, direction.test):
            assert all(split.src(i)[0] == direction.tag_ids[0] for i in range(len(split)))
            assert not set(ids.values()) & set(np.asarray(split.tgt_tokens).tolist())
        # after the tag, the sentence as the tokenizer encodes it
        assert direction.valid.src(0)[1:-1].tolist() == tok.encode_src(direction.valid_text.src[0])
    assert data.valid is data.directions[0].valid and data.test_text == data.directions[0].test_text


# ----------------------------------------------------------------------------- overlap
def test_overlap_is_counted_exactly_and_dropped_on_request(corpus, tmp_path):
    directory = tmp_path / "leaky"
    directory.mkdir()
    for name in ("val", "test"):
        for lang in ("de", "en"):
            (directory / f"{name}.{lang}").write_text((corpus / f"{name}.{lang}").read_text("utf-8"), "utf-8")
    train = list(zip(lines(corpus / "train.de")[:40], lines(corpus / "train.en")[:40], strict=True))
    val = list(zip(lines(corpus / "val.de"), lines(corpus / "val.en"), strict=True))
    test = list(zip(lines(corpus / "test.de"), lines(corpus / "test.en"), strict=True))
    # 3 sources of val (one with its reference), 2 of test (one with its reference), a val pair twice
    leaks = [val[0], (val[1][0], "a cat"), (val[2][0], "the dog"), test[0], (test[1][0], "one house"), val[0]]
    for side, lang in enumerate(("de", "en")):
        (directory / f"train.{lang}").write_text("".join(pair[side] + "\n" for pair in train + leaks), "utf-8")
    data, log = prepare(data_config(directory, tmp_path / "cache", name="leaky"))
    overlap = data.summary["corpora"][0]["eval_overlap"]
    assert overlap == {
        "valid": {"source": 4, "pair": 2},
        "test": {"source": 2, "pair": 1},
        "any": {"source": 6, "pair": 3},
    }
    assert "6 of 46 kept pairs have their source in valid and test of de-en, 3 the whole pair" in log
    dropping = data_config(directory, tmp_path / "cache", name="leaky")
    dropping.clean.drop_eval_overlap = True
    dropped, log = prepare(dropping)
    record = dropped.summary["corpora"][0]
    assert record["train"]["filtered"] == {"eval_overlap": 6} and len(dropped.train) == 40
    assert record["eval_overlap"]["any"] == {"source": 0, "pair": 0} and "filtered (eval_overlap 6)" in log
    assert dropped.directory != data.directory  # dropping is part of the training corpus's key


# ----------------------------------------------------------------------------- provenance
def test_a_corpus_written_by_translate_records_which_model_made_it(corpus, tmp_path):
    synthetic = tmp_path / "bt"
    synthetic.mkdir()
    for lang in ("de", "en"):
        (synthetic / f"train.{lang}").write_text((corpus / f"train.{lang}").read_text("utf-8"), "utf-8")
    checkpoint = tmp_path / "reverse" / "checkpoints" / "best.pt"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"weights")
    write_provenance(
        synthetic / "train.de",
        str(tmp_path / "reverse"),
        [checkpoint],
        {"beam": 1, "sampling": "topk"},
        str(synthetic / "train.en"),
        "test",
    )
    assert provenance_path(synthetic / "train.de").is_file()
    corpora = [CorpusConfig(), CorpusConfig(name="bt", local_dir=str(synthetic), tag="bt")]
    data, log = prepare(data_config(corpus, tmp_path / "cache", corpora=corpora))
    real, back = data.summary["corpora"]
    assert "provenance" not in real and len(back["provenance"]) == 1
    record = back["provenance"][0]
    assert record["matches"] is True and record["decode"]["sampling"] == "topk"
    assert record["checkpoints"][0]["path"] == str(checkpoint.absolute())
    assert record["checkpoints"][0]["sha256"] == hashlib.sha256(b"weights").hexdigest()
    assert record["input"] == str((synthetic / "train.en").absolute())
    assert "was written by `mtrain translate`" in log


# ----------------------------------------------------------------------------- bad input
def fit_config(**data_values) -> OmegaConf:
    overrides = OmegaConf.create({})
    for key, value in data_values.items():
        OmegaConf.update(overrides, key, value)
    return OmegaConf.merge(OmegaConf.structured(FitConfig), overrides)


@pytest.mark.parametrize(
    "values, message",
    [
        ({"data.corpora": [{"weight": 0}]}, "data.corpora[0].weight: 0.0 must be > 0"),
        ({"data.corpora": [{"weight": float("inf")}]}, "data.corpora[0].weight: inf must be a finite number"),
        (
            {"data.corpora": [{}, {"tgt": "fr"}], "tokenizer.joint": True},
            "data.lang_tags: false, but data.corpora translates de into en and fr",
        ),
        ({"data.sampling_temperature": 0.0}, "data.sampling_temperature: 0.0 must be > 0"),
        ({"data.corpora": [{}, {"src": "en", "tgt": "en"}]}, "data.corpora[1].tgt: 'en' is also its source language"),
        ({"data.corpora": [{"tag": "s"}]}, "data.corpora[0].tag: 's' makes <s>, a special piece"),
        ({"data.corpora": [{"tag": "/s"}]}, "data.corpora[0].tag: '/s' makes </s>"),
        ({"data.corpora": [{"tag": "b t"}]}, "data.corpora[0].tag: 'b t' must be a non-empty name without spaces"),
        (
            {"data.corpora": [{"tag": "2en"}], "data.lang_tags": True},
            "data.corpora[0].tag: <2en> is also a target-language",
        ),
        ({"data.lang_tags": True, "tokenizer.joint": False}, "data.lang_tags: the language tags need one vocabulary"),
        ({"data.corpora": [{}, {"src": "en", "tgt": "de"}], "tokenizer.joint": False}, "tokenizer.joint: false, but"),
        (
            {"data.corpora": [{}, {}], "data.subword_sampling.alpha": 0.5},
            "data.subword_sampling.alpha: subword sampling",
        ),
    ],
)
def test_bad_corpora_settings_are_refused_naming_the_key(values, message):
    cfg = fit_config(**values)
    with pytest.raises(MtrainError) as error:
        check_corpora(cfg.data, cfg.tokenizer)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_a_tag_that_real_text_contains_is_refused(corpus, tmp_path):
    tagged = tmp_path / "tagged"
    tagged.mkdir()
    for lang in ("de", "en"):
        text = (corpus / f"train.{lang}").read_text("utf-8")
        (tagged / f"train.{lang}").write_text(("ein <bt> Haus\n" if lang == "de" else "a house\n") + text, "utf-8")
    corpora = [CorpusConfig(), CorpusConfig(name="other", local_dir=str(tagged), tag="bt")]
    with pytest.raises(
        MtrainError,
        match=r"^data\.corpora\[1\]\.tag: the tag symbol <bt> occurs in the training "
        r"text of data\.corpora\[1\] \(name other, pair 1\)",
    ):
        prepare(data_config(corpus, tmp_path / "cache", corpora=corpora))


def test_a_direction_without_validation_data_names_the_language(corpus, tmp_path):
    partial = tmp_path / "partial"
    partial.mkdir()
    for path in corpus.iterdir():
        if not (path.name.startswith(("val.", "test.")) and path.name.endswith(".fr")):
            (partial / path.name).write_bytes(path.read_bytes())
    corpora = [CorpusConfig(), CorpusConfig(src="de", tgt="fr")]
    with pytest.raises(MtrainError) as error:
        prepare(data_config(partial, tmp_path / "cache", corpora=corpora, lang_tags=True))
    message = str(error.value)
    assert message.startswith("data.corpora[1].tgt=fr: data=tri has no validation/test data in this language")
    assert "val.fr[.gz]" in message and "\n" not in message


def mtrain_command(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return run_mtrain(*args, cwd=cwd, env=env, text=True, timeout=120)


def test_the_command_refuses_a_misspelt_corpus_key_and_an_unreadable_corpus(tmp_path):
    misspelt = mtrain_command("fit", "data.corpora=[{nmae: x}]", cwd=tmp_path)
    assert misspelt.returncode == 2 and misspelt.stderr.strip().count("\n") == 0
    assert misspelt.stderr.strip() == (
        "mtrain: error: data.corpora[0].nmae: unknown config key; check its spelling "
        "(did you mean data.corpora[0].name?)"
    )
    missing = tmp_path / "nowhere"
    unreadable = mtrain_command(
        "prepare",
        f"data.corpora=[{{name: bt, local_dir: '{missing}'}}]",
        f"data.cache_dir={tmp_path / 'cache'}",
        cwd=tmp_path,
    )
    assert unreadable.returncode == 2 and unreadable.stderr.strip().count("\n") == 0, unreadable.stderr
    assert unreadable.stderr.startswith(f"mtrain: error: data.corpora[0].local_dir={missing}: cannot read")
    assert list(tmp_path.iterdir()) == []  # refused before anything was written


def test_per_corpus_config_takes_data_values_where_unset():
    from mtrain.data.corpora import corpus_config

    data = DataConfig(
        name="multi30k",
        local_dir="/d",
        train_limit=7,
        corpora=[CorpusConfig(), CorpusConfig(name="bt", split="mono", train_limit=3, src="en", tgt="de")],
    )
    same, other = corpus_config(data, 0), corpus_config(data, 1)
    assert (same.name, same.local_dir, same.train_limit, same.splits.train, same.src) == (
        "multi30k",
        "/d",
        7,
        "train",
        "de",
    )
    assert (other.name, other.local_dir, other.train_limit, other.splits.train) == ("bt", None, 3, "mono")
    assert (other.src, other.tgt, other.splits.valid, other.splits.test) == ("en", "de", None, None)
    assert dataclasses.asdict(same.clean) == dataclasses.asdict(data.clean)
