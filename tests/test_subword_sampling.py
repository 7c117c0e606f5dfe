"""Subword sampling (data.subword_sampling): sampled copies of the training split, one per epoch."""

from __future__ import annotations

import logging
import shutil

import numpy as np
import pytest

from mtrain.batches.corpus import EncodedCorpus
from mtrain.batches.prepare import prepare_data
from mtrain.checkpoint.files import load_run
from mtrain.config import DataConfig, SubwordSamplingConfig, TokenizerConfig
from mtrain.errors import MtrainError
from tests.fit_runs import TINY, check_resume_is_exact, compose_fit
from tests.prepared_data import same_arrays, silent

TOKENIZER = TokenizerConfig(vocab_size=600)


def sampled_config(multi30k_slice, cache, num_workers: int = 1, **sampling) -> DataConfig:
    return DataConfig(
        local_dir=str(multi30k_slice),
        cache_dir=str(cache),
        train_limit=600,
        num_workers=num_workers,
        subword_sampling=SubwordSamplingConfig(**{"alpha": 0.3, "copies": 3, **sampling}),
    )


def texts(tokenizer, corpus: EncodedCorpus):
    return (
        [tokenizer.decode_tgt(corpus.src(i)) for i in range(len(corpus))],
        [tokenizer.decode_tgt(corpus.tgt(i)) for i in range(len(corpus))],
    )


def test_copies_resegment_the_same_pairs_and_are_reproducible(multi30k_slice, tmp_path):
    messages = []
    data = prepare_data(sampled_config(multi30k_slice, tmp_path / "a"), TOKENIZER, log=messages.append)
    assert len(data.train_copies) == 3 and data.training_corpora() == [data.train, *data.train_copies]
    deterministic = texts(data.tokenizer, data.train)
    for copy in data.train_copies:
        assert len(copy) == len(data.train)
        assert texts(data.tokenizer, copy) == deterministic  # the same pairs, in the same order
        assert all(copy.src(i)[-1] == data.tokenizer.eos_id for i in range(len(copy)))
        changed = np.mean([not np.array_equal(copy.tgt(i), data.train.tgt(i)) for i in range(len(copy))])
        assert 0.3 < changed < 1.0
    # each copy draws its own segmentation
    assert not same_arrays(data.train_copies[0], data.train_copies[1])
    # validation and test are never sampled
    plain = prepare_data(
        DataConfig(local_dir=str(multi30k_slice), cache_dir=str(tmp_path / "a"), train_limit=600), TOKENIZER, log=silent
    )
    assert same_arrays(plain.valid, data.valid) and same_arrays(plain.train, data.train)
    assert plain.train_copies == [] and plain.fingerprint != data.fingerprint
    # built again, in two worker processes: the same copies; a second call reuses them
    shutil.rmtree(data.train_copies[0].directory.parent)
    again = prepare_data(sampled_config(multi30k_slice, tmp_path / "a", num_workers=2), TOKENIZER, log=silent)
    assert all(same_arrays(a, b) for a, b in zip(data.train_copies, again.train_copies, strict=True))
    assert again.fingerprint == data.fingerprint
    cached = []
    prepare_data(sampled_config(multi30k_slice, tmp_path / "a"), TOKENIZER, log=cached.append)
    entry = again.train_copies[0].directory.parent  # named by its cache key: the log says which was reused
    assert any("reusing 3 sampled segmentations" in m and m.endswith(f" in {entry}") for m in cached)
    assert not any("sampled segmentations of the training split (alpha" in m and " s -> " in m for m in cached)
    other = prepare_data(sampled_config(multi30k_slice, tmp_path / "a", alpha=0.5), TOKENIZER, log=silent)
    assert other.fingerprint != data.fingerprint
    assert not same_arrays(other.train_copies[0], data.train_copies[0])


@pytest.mark.parametrize(
    "model_type, sampling, key",
    [
        ("unigram", {"alpha": -0.1}, "data.subword_sampling.alpha"),
        ("bpe", {"alpha": 1.0}, "data.subword_sampling.alpha"),
        ("unigram", {"alpha": 0.2, "nbest_size": 1}, "data.subword_sampling.nbest_size"),
        ("unigram", {"alpha": 0.2, "copies": 0}, "data.subword_sampling.copies"),
    ],
)
def test_bad_sampling_settings_fail_before_any_work(multi30k_slice, tmp_path, model_type, sampling, key):
    cfg = DataConfig(
        local_dir=str(multi30k_slice), cache_dir=str(tmp_path), subword_sampling=SubwordSamplingConfig(**sampling)
    )
    with pytest.raises(MtrainError, match=key):
        prepare_data(cfg, TokenizerConfig(vocab_size=600, model_type=model_type), log=silent)
    assert not (tmp_path / "tokenizers").exists()  # refused before the tokenizer was trained


def test_separate_vocabularies_sample_each_side_with_its_own_model(multi30k_slice, tmp_path):
    data = prepare_data(
        sampled_config(multi30k_slice, tmp_path, copies=1), TokenizerConfig(vocab_size=600, joint=False), log=silent
    )
    copy, tokenizer = data.train_copies[0], data.tokenizer
    assert not tokenizer.joint
    for i in range(0, len(copy), 50):
        # the pieces of a sentence spell the same text however it was cut
        assert "".join(tokenizer.src_pieces(copy.src(i)[:-1])) == "".join(tokenizer.src_pieces(data.train.src(i)[:-1]))
        assert tokenizer.decode_tgt(copy.tgt(i)) == tokenizer.decode_tgt(data.train.tgt(i))
    assert (
        int(copy.src_tokens.max()) < tokenizer.src_vocab_size and int(copy.tgt_tokens.max()) < tokenizer.tgt_vocab_size
    )


def test_bpe_dropout_copies(multi30k_slice, tmp_path):
    data = prepare_data(
        sampled_config(multi30k_slice, tmp_path, alpha=0.1, copies=1),
        TokenizerConfig(vocab_size=600, model_type="bpe"),
        log=silent,
    )
    copy = data.train_copies[0]
    assert texts(data.tokenizer, copy) == texts(data.tokenizer, data.train)
    assert copy.tgt_lengths.sum() > data.train.tgt_lengths.sum()  # dropped merges: more pieces


# Which copy each epoch trains on: tests/test_train_batch_source.py.


def test_fit_with_subword_sampling_resumes_exactly_across_copies(multi30k_slice, tmp_path, caplog):
    """12 updates cross from copy 0 into copy 1 (250 pairs: a few batches an epoch); a run stopped at 6
    and resumed continues on the same copies, batch for batch; the softmax covers the pieces
    of every copy."""
    common = [
        f"data.local_dir={multi30k_slice}",
        f"data.cache_dir={tmp_path / 'cache'}",
        *TINY,
        "train.log_every=1",
        "train.valid_bleu=false",
        "train.validate_every=6",
        "data.train_limit=250",
        "data.subword_sampling.alpha=0.3",
        "data.subword_sampling.copies=2",
        "model.output_vocab=target",
    ]
    with caplog.at_level(logging.INFO, logger="mtrain"):
        straight, _, summary = check_resume_is_exact(common, tmp_path)
    assert summary["epochs"] >= 2
    assert "2 sampled segmentations of the training split" in caplog.text and "subword sampling:" in caplog.text

    cfg = compose_fit(common)
    data = prepare_data(cfg.data, cfg.tokenizer, log=silent)
    pieces = set(np.unique(np.concatenate([c.tgt_tokens for c in data.training_corpora()])).tolist())
    assert pieces - set(np.unique(np.asarray(data.train.tgt_tokens)).tolist())  # copies add pieces
    assert pieces <= set(load_run(straight, which="last").model.output_ids.tolist())
