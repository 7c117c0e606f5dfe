"""Cleaning filters (mtrain.data.cleaning), alone and inside prepare_data."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from mtrain.batches.prepare import prepare_data
from mtrain.config import DataConfig, TokenizerConfig
from mtrain.data.cleaning import (
    KEEP,
    REASONS,
    Deduplicator,
    check_clean_config,
    classify_pairs,
    count_reasons,
    normalizer,
    pair_hashes,
)
from mtrain.errors import MtrainError


def clean(**overrides):
    values = dict(max_len=10, min_len=2, max_len_ratio=2.0, drop_identical=True, deduplicate=True, normalize=None)
    values.update(overrides)
    return SimpleNamespace(**values)


def code(reason: str) -> int:
    return REASONS.index(reason) + 1


def test_each_filter_rejects_exactly_its_pairs():
    pairs = [
        ("ein hund", "a dog", 3, 3, KEEP),
        ("", "a dog", 0, 3, code("empty")),
        ("ein hund", "", 3, 0, code("empty")),
        ("same", "same", 3, 3, code("identical")),
        ("kurz", "a short one", 1, 3, code("too_short")),
        ("lang", "long", 11, 9, code("too_long")),
        ("lang", "long", 9, 11, code("too_long")),
        ("x", "y", 10, 10, KEEP),  # max_len is inclusive
        ("x", "y", 2, 5, code("length_ratio")),  # 2.5 > 2.0
        ("x", "y", 2, 4, KEEP),  # a ratio of exactly 2.0 passes
        ("x", "y", 6, 3, KEEP),
    ]
    src, tgt, src_len, tgt_len, expected = zip(*pairs, strict=True)
    codes = classify_pairs(list(src), list(tgt), np.array(src_len), np.array(tgt_len), clean())
    assert codes.tolist() == list(expected)
    counts = count_reasons(codes)
    assert counts == {
        "empty": 2,
        "identical": 1,
        "too_short": 1,
        "too_long": 2,
        "length_ratio": 1,
        "eval_overlap": 0,
        "duplicate": 0,
    }


def test_identical_pairs_are_kept_unless_asked():
    codes = classify_pairs(["same"], ["same"], np.array([3]), np.array([3]), clean(drop_identical=False))
    assert codes.tolist() == [KEEP]


def test_deduplicator_keeps_first_occurrences_across_chunks():
    dedupe = Deduplicator()
    first = pair_hashes(["a", "b", "a", "c"], ["x", "y", "x", "z"])
    assert dedupe.first_occurrences(first).tolist() == [True, True, False, True]
    second = pair_hashes(["c", "d", "b", "d"], ["z", "w", "y", "w"])
    assert dedupe.first_occurrences(second).tolist() == [False, True, False, False]
    # The separator cannot be forged by tabs inside the text.
    assert len(set(pair_hashes(["a\tb", "a"], ["c", "b\tc"]).tolist())) == 2


def test_normalizer():
    assert normalizer("NFKC")("ﬁne ｆｕｌｌ") == "fine full"
    assert normalizer("NFC")("e\u0301") == "\u00e9"
    assert normalizer(None)("ﬁ") == "ﬁ"


@pytest.mark.parametrize(
    "overrides",
    [dict(normalize="NFD"), dict(min_len=5, max_len=4), dict(max_len_ratio=0.5)],
)
def test_bad_clean_settings_are_rejected(overrides):
    with pytest.raises(MtrainError, match="data.clean"):
        check_clean_config(clean(**overrides))


# ------------------------------------------------------------------ inside prepare_data
@pytest.fixture
def crafted_corpus(tmp_path, multi30k_slice):
    """300 real pairs plus pairs each filter must remove, and a valid split with odd pairs."""
    de = (multi30k_slice / "train.de").read_text(encoding="utf-8").splitlines()[:300]
    en = (multi30k_slice / "train.en").read_text(encoding="utf-8").splitlines()[:300]
    pairs = list(zip(de, en, strict=True))
    injected = {
        "empty": [("", en[0]), (de[1], "")],
        "identical": [("Tom Hanks", "Tom Hanks"), ("OK.", "OK.")],
        "too_long": [(" ".join(["Hund"] * 300), " ".join(["dog"] * 300))],
        "length_ratio": [("Hund", " ".join(["dog"] * 60))],
        # exact repeats, one right after a chunk boundary, and one equal after NFKC only
        "duplicate": [pairs[3], pairs[60], (de[7].replace("A", "Ａ"), en[7])],
    }
    rows = pairs[:49] + injected["empty"] + pairs[49:]
    rows.insert(50, pairs[2])  # a duplicate at position 50: the first pair of the second chunk
    rows += injected["identical"] + injected["too_long"] + injected["length_ratio"]
    rows += [injected["duplicate"][0], injected["duplicate"][1], injected["duplicate"][2]]
    directory = tmp_path / "crafted"
    directory.mkdir()
    for split, split_rows in (
        ("train", rows),
        ("val", [("Hallo", "Hallo"), ("", "nothing"), (de[5], en[5])]),
        ("test", [(de[6], en[6])]),
    ):
        for side, lang in ((0, "de"), (1, "en")):
            (directory / f"{split}.{lang}").write_text("".join(r[side] + "\n" for r in split_rows), encoding="utf-8")
    expected_duplicates = 4
    return directory, pairs, injected, expected_duplicates


def test_prepare_filters_training_pairs_by_reason(crafted_corpus, tmp_path):
    directory, pairs, _injected, expected_duplicates = crafted_corpus
    data = DataConfig(local_dir=str(directory), cache_dir=str(tmp_path / "cache"), chunk_size=50)
    data.splits.test = "test"
    data.clean.max_len = 200
    data.clean.max_len_ratio = 9.0
    data.clean.drop_identical = True
    data.clean.deduplicate = True
    data.clean.normalize = "NFKC"
    lines = []
    prepared = prepare_data(data, TokenizerConfig(vocab_size=600), log=lines.append)

    summary = "\n".join(lines)
    assert "empty 2" in summary and "identical 2" in summary and "too_long 1" in summary
    assert "length_ratio 1" in summary and f"duplicate {expected_duplicates}" in summary
    assert len(prepared.train) == len(pairs)
    decoded = [prepared.tokenizer.decode_tgt(prepared.train.tgt(i)) for i in range(len(prepared.train))]
    assert decoded == [" ".join(en.split()) for _, en in pairs]
    # Validation is never filtered: the identical and the empty-source pair stay.
    assert len(prepared.valid) == 3 and prepared.valid_text.src == ["Hallo", "", pairs[5][0]]
    assert prepared.valid.src(1).tolist() == [prepared.tokenizer.eos_id]


def test_a_corpus_empty_after_filtering_is_a_clear_error(crafted_corpus, tmp_path):
    directory, *_ = crafted_corpus
    data = DataConfig(local_dir=str(directory), cache_dir=str(tmp_path / "cache"))
    data.splits.test = "test"
    data.clean.max_len = 2  # every real sentence is longer
    with pytest.raises(MtrainError, match=r"empty after filtering .*too_long \d+.*relax data\.clean"):
        prepare_data(data, TokenizerConfig(vocab_size=600), log=lambda _: None)
    assert not list((tmp_path / "cache" / "corpora").glob("*tmp*")), "the failed build was not cleaned up"
