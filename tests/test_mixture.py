"""Several training corpora: each one's share of an epoch by weight and temperature, the draw
(deterministic in seed and epoch, exactly resumable), the concatenated view's batches, and the
single corpus left exactly as it was."""

from __future__ import annotations

import copy
import functools
import logging
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from mtrain.batches import TokenBatchSampler, collate
from mtrain.batches.corpus import EncodedCorpus
from mtrain.batches.mixture import (
    ConcatenatedCorpus,
    CorpusMixture,
    CorpusPart,
    MixtureSampler,
    corpus_labels,
    corpus_shares,
    draw_corpus,
    draw_counts,
)
from mtrain.config import Precision
from mtrain.model import build_model
from mtrain.tokenizer import SpecialIds
from mtrain.train.batch_source import BatchSource, training_corpora
from mtrain.train.builders import build_parts
from mtrain.train.distributed import DistributedContext
from mtrain.train.metric_log import MetricLogger
from mtrain.train.progress import TrainState
from mtrain.train.random_state import seed_everything
from mtrain.train.trainer import Trainer
from tests.fit_runs import assert_refused, compose_fit, run_check

IDS = SpecialIds(unk=0, pad=1, bos=2, eos=3)
VOCAB = 60
FIELDS = ("src_tokens", "src_padding_mask", "tgt_input", "tgt_output", "indices")


def _sequences(sentences: int, seed: int, first_id: int = 4):
    """Random pairs whose target ids start at `first_id` (so a corpus can be told by its pieces)."""
    rng = np.random.default_rng(seed)
    sources = [list(rng.integers(4, VOCAB, rng.integers(2, 14))) + [IDS.eos] for _ in range(sentences)]
    targets = [list(rng.integers(first_id, first_id + 10, rng.integers(1, 16))) for _ in range(sentences)]
    return sources, targets


def _parts(sizes=(120, 480, 40), weights=(1.0, 1.0, 1.0)):
    parts, sequences = [], ([], [])
    for i, (size, weight) in enumerate(zip(sizes, weights, strict=True)):
        src, tgt = _sequences(size, seed=i, first_id=4 + 10 * i)
        parts.append(CorpusPart(f"c{i}", "de", "en", EncodedCorpus.from_sequences(src, tgt), weight))
        sequences[0].extend(src)
        sequences[1].extend(tgt)
    return parts, EncodedCorpus.from_sequences(*sequences)


def _source(corpora, prefetch=False, update_freq=1, seed=1):
    return BatchSource(
        corpora,
        IDS,
        torch.device("cpu"),
        max_tokens=150,
        update_freq=update_freq,
        max_epochs=None,
        seed=seed,
        pad_to_multiple=1,
        prefetch=prefetch,
    )


def _same_batch(a, b) -> bool:
    return all(torch.equal(getattr(a, f), getattr(b, f)) for f in FIELDS) and (a.num_src_tokens, a.num_tgt_tokens) == (
        b.num_src_tokens,
        b.num_tgt_tokens,
    )


# ---------------------------------------------------------------------- shares
def test_shares_are_weight_times_size_to_the_one_over_t():
    sizes = np.array([100, 400, 1600])
    assert np.allclose(corpus_shares(sizes, [1, 1, 1], 1.0), sizes / sizes.sum())  # by size
    assert np.allclose(corpus_shares(sizes, [1, 1, 1], 2.0), np.sqrt(sizes) / np.sqrt(sizes).sum())
    weighted = np.array([3.0, 1.0, 0.5]) * sizes
    assert np.allclose(corpus_shares(sizes, [3, 1, 0.5], 1.0), weighted / weighted.sum())
    # a large temperature: uniform over the corpora, whatever their sizes; weights act as ratios
    assert np.allclose(corpus_shares([10, 1000, 100000], [1, 1, 1], 1e6), 1 / 3, atol=1e-4)
    assert np.allclose(corpus_shares([10, 1000, 100000], [1, 2, 3], 1e6), [1 / 6, 2 / 6, 3 / 6], atol=1e-4)
    assert corpus_shares([0, 50], [5, 1], 1.0).tolist() == [0.0, 1.0]  # an empty corpus gets nothing


@pytest.mark.parametrize(
    "sizes, weights, temperature",
    [([0, 0], [1, 1], 1.0), ([5], [1], 0.0), ([5, 5], [1, -1], 1.0), ([5, 5], [0, 0], 2.0), ([5, 5], [1], 1.0)],
)
def test_shares_refuse_what_cannot_be_drawn(sizes, weights, temperature):
    with pytest.raises(ValueError):
        corpus_shares(sizes, weights, temperature)


def test_counts_add_up_to_the_epoch_and_round_each_share():
    for shares, total in ([[0.5, 0.25, 0.25], 10], [[1 / 3] * 3, 100], [[0.123, 0.456, 0.421], 997]):
        counts = draw_counts(np.array(shares), total)
        assert counts.sum() == total and np.all(np.abs(counts - np.array(shares) * total) < 1)
    sizes = np.array([7, 1000, 13, 29])  # temperature 1, weights 1: each corpus's own size, exactly
    assert draw_counts(corpus_shares(sizes, [1] * 4, 1.0), int(sizes.sum())).tolist() == sizes.tolist()


def test_a_corpus_is_repeated_whole_then_subsampled_without_replacement():
    rng = np.random.default_rng(0)
    drawn = draw_corpus(10, 37, rng)  # 3 passes and 7 more, each pair at most once among them
    occurrences = np.bincount(drawn, minlength=10)
    assert len(drawn) == 37 and sorted(occurrences.tolist()) == [3] * 3 + [4] * 7
    assert np.bincount(draw_corpus(100, 60, rng), minlength=100).max() == 1
    assert len(draw_corpus(0, 0, rng)) == 0


def test_drawn_shares_match_the_configured_ones_within_sampling_error():
    """Three corpora of different sizes and weights at T=2, over several epochs: each epoch holds
    each corpus's share of pairs (to the pair), every pair of a subsampled corpus is drawn as often
    as its rate says (within 5 sigma, a binomial per pair), and the token shares follow."""
    parts, _ = _parts(sizes=(120, 480, 40), weights=(1.0, 0.5, 2.0))
    mixture = CorpusMixture(parts, temperature=2.0)
    sizes = np.array([120, 480, 40])
    expected = np.array([1.0, 0.5, 2.0]) * np.sqrt(sizes)
    expected /= expected.sum()
    epochs, total = 40, int(sizes.sum())
    per_pair = np.zeros(total)
    for epoch in range(1, epochs + 1):
        indices = mixture.draw(seed=3, epoch=epoch)
        draw = mixture.summarize(epoch, indices)
        assert len(indices) == total
        assert np.all(np.abs(np.array(draw.pairs) - expected * total) < 1)
        per_pair += np.bincount(indices, minlength=total)
    rate = mixture.counts / sizes  # draws per pair and epoch
    for part, (start, size) in enumerate(zip(mixture.corpus.starts[:-1], sizes, strict=True)):
        counts = per_pair[start : start + size]
        assert counts.sum() == epochs * mixture.counts[part]
        fraction = rate[part] - np.floor(rate[part])
        sigma = np.sqrt(epochs * fraction * (1 - fraction))
        assert np.all(np.abs(counts - epochs * rate[part]) <= 5 * sigma + 1e-9)
    # the tokens of each corpus over all epochs: its pairs' mean target length times its pairs drawn
    labels = mixture.corpus.tgt_lengths + 1
    tokens = np.bincount(mixture.corpus.locate(np.arange(total))[0], weights=per_pair * labels)
    means = np.array([labels[s : s + n].mean() for s, n in zip(mixture.corpus.starts[:-1], sizes, strict=True)])
    stds = np.array([labels[s : s + n].std() for s, n in zip(mixture.corpus.starts[:-1], sizes, strict=True)])
    drawn = epochs * mixture.counts
    assert np.all(np.abs(tokens - drawn * means) <= 4 * stds * np.sqrt(drawn))


def test_the_draw_is_a_function_of_seed_and_epoch_alone():
    parts, _ = _parts()
    mixture = CorpusMixture(parts, temperature=3.0)
    late = CorpusMixture(parts, temperature=3.0).draw(seed=1, epoch=5)  # no earlier epoch drawn first
    for epoch in range(1, 5):
        mixture.draw(seed=1, epoch=epoch)
    assert np.array_equal(mixture.draw(seed=1, epoch=5), late)
    assert not np.array_equal(mixture.draw(seed=1, epoch=6), late)
    assert not np.array_equal(mixture.draw(seed=2, epoch=5), late)


# ---------------------------------------------------------------------- the concatenated view
def test_the_concatenated_view_collates_as_one_corpus_of_the_same_pairs():
    parts, whole = _parts()
    empty = EncodedCorpus.from_sequences([], [])
    view = ConcatenatedCorpus([parts[0].corpus, empty, parts[1].corpus, parts[2].corpus])  # an empty part is skipped
    assert len(view) == len(whole) and np.array_equal(view.tgt_lengths, whole.tgt_lengths)
    assert np.array_equal(view.target_pieces(), whole.target_pieces())
    indices = np.random.default_rng(0).integers(0, len(whole), 64)  # duplicates, every part, any order
    for multiple in (1, 8):
        assert _same_batch(
            collate(view, indices, IDS.pad, IDS.bos, IDS.eos, multiple),
            collate(whole, indices, IDS.pad, IDS.bos, IDS.eos, multiple),
        )
    assert all(
        np.array_equal(view.src(i), whole.src(i)) and np.array_equal(view.tgt(i), whole.tgt(i))
        for i in (0, 119, 120, 599, 639)
    )


def test_temperature_one_and_equal_weights_is_the_concatenation_batch_for_batch():
    parts, whole = _parts()
    mixed, concatenated = _source(CorpusMixture(parts, 1.0)), _source([whole])
    state_a, state_b = TrainState(), TrainState()
    seen = []
    while state_a.epoch <= 2:
        (a,), (b,) = mixed.next_update(state_a), concatenated.next_update(state_b)
        assert _same_batch(a, b)
        if state_a.epoch == 1:
            seen.extend(a.indices.tolist())
    assert sorted(seen) == list(range(len(whole)))  # every pair exactly once in the epoch


def test_an_epochs_batches_hold_exactly_the_draw():
    parts, _ = _parts(weights=(2.0, 1.0, 1.0))
    mixture = CorpusMixture(parts, temperature=4.0)
    source, state = _source(mixture), TrainState()
    batches = []
    while state.epoch == 1:
        batches.append(source.next_update(state)[0].indices.tolist())
    trained = [i for batch in batches[:-1] for i in batch]  # the last update began epoch 2
    assert sorted(trained) == sorted(mixture.draw(seed=1, epoch=1).tolist())


def test_ranks_share_one_draw_and_split_its_batches():
    parts, _ = _parts()
    mixture = CorpusMixture(parts, temperature=5.0)
    options = dict(max_tokens=150, seed=1, pad_to_multiple=1)
    alone = MixtureSampler(mixture, **options).batches(3)
    ranks = [MixtureSampler(mixture, num_replicas=2, rank=r, **options).batches(3) for r in (0, 1)]
    usable = len(alone) - len(alone) % 2
    assert [b.tolist() for b in ranks[0]] == [b.tolist() for b in alone[0:usable:2]]
    assert [b.tolist() for b in ranks[1]] == [b.tolist() for b in alone[1:usable:2]]


# ---------------------------------------------------------------------- resume and the single corpus
@pytest.mark.parametrize("prefetch", [False, True])
def test_a_mixture_resumed_from_its_state_continues_batch_for_batch_across_epochs(prefetch):
    parts, _ = _parts(weights=(1.0, 0.3, 3.0))
    mixture = CorpusMixture(parts, temperature=2.0)
    source, state = _source(mixture, prefetch=prefetch, update_freq=2), TrainState()
    for _ in range(9):  # into epoch 1, well short of its end
        source.next_update(state)
    saved = copy.deepcopy(state)
    expected = []
    while state.epoch <= 3:
        expected.append(source.next_update(state))
    resumed = _source(CorpusMixture(parts, temperature=2.0), prefetch=prefetch, update_freq=2)
    got = [resumed.next_update(saved) for _ in expected]
    assert saved == state and len(expected) > 20
    assert all(len(a) == len(b) and all(map(_same_batch, a, b)) for a, b in zip(expected, got, strict=True))


def test_a_single_corpus_trains_on_exactly_the_batches_it_always_did():
    """One part (whatever its weight or the temperature) takes the path of one corpus: the token
    sampler over that corpus, or its subword-sampling copies by epoch."""
    (part, *_), _ = _parts()
    heavy = CorpusPart("c0", "de", "en", part.corpus, weight=7.0)
    data = SimpleNamespace(train=part.corpus, train_copies=[], train_parts=[heavy])
    assert training_corpora(data, temperature=5.0) == [part.corpus]
    copies = [EncodedCorpus.from_sequences(*_sequences(120, seed=9)), part.corpus]
    assert training_corpora(SimpleNamespace(train=part.corpus, train_copies=copies, train_parts=[heavy]), 5.0) == copies
    assert training_corpora(SimpleNamespace(train=part.corpus, train_copies=[], train_parts=[]), 1.0) == [part.corpus]
    assert isinstance(
        training_corpora(SimpleNamespace(train=None, train_copies=[], train_parts=[heavy, heavy]), 1.0), CorpusMixture
    )
    source, state = _source(training_corpora(data, 5.0)), TrainState()
    sampler = TokenBatchSampler(part.corpus.src_lengths, part.corpus.tgt_lengths, 150, seed=1)
    expected = [collate(part.corpus, b, IDS.pad, IDS.bos, IDS.eos) for e in (1, 2) for b in sampler.batches(e)]
    assert all(_same_batch(source.next_update(state)[0], batch) for batch in expected)


def test_labels_name_each_corpus_once():
    corpus = EncodedCorpus.from_sequences([[3]], [[4]])
    assert corpus_labels([CorpusPart("m30k", "de", "en", corpus), CorpusPart("bt", "de", "en", corpus)]) == [
        "m30k",
        "bt",
    ]
    assert corpus_labels([CorpusPart("m30k", "de", "en", corpus), CorpusPart("m30k", "en", "de", corpus)]) == [
        "m30k-de-en",
        "m30k-en-de",
    ]
    assert corpus_labels([CorpusPart("x", "de", "en", corpus)] * 2) == ["x-de-en#1", "x-de-en#2"]


# ---------------------------------------------------------------------- a trainer on a mixture
@functools.lru_cache(maxsize=1)
def _tiny_config():
    return compose_fit(
        [
            "model.encoder_layers=1",
            "model.decoder_layers=1",
            "model.d_model=32",
            "model.heads=2",
            "model.ffn_dim=64",
            "model.dropout=0.0",
            "train.max_tokens=150",
            "train.warmup_updates=5",
            "train.valid_bleu=false",
        ]
    )


def _trainer(parts, metrics=None) -> Trainer:
    cfg = _tiny_config()
    seed_everything(cfg.seed)
    model = build_model(cfg.model, VOCAB, VOCAB, IDS.pad, joint_vocab=True)
    data = SimpleNamespace(train=None, train_copies=[], train_parts=parts)
    built = build_parts(
        model, cfg.train, cfg.seed, training_corpora(data, 2.0), IDS, torch.device("cpu"), Precision.fp32
    )
    return Trainer(cfg.train, built, DistributedContext(), metrics=metrics, validate=lambda: {"loss": 1.0})


def test_a_trainer_on_a_mixture_logs_each_epochs_draw_and_resumes_exactly(caplog):
    parts, _ = _parts(sizes=(40, 100, 15), weights=(1.0, 1.0, 2.0))
    metrics = MetricLogger(None, None, 0, lambda src, tgt: 1.0, None)
    scalars = []  # what TensorBoard would get
    metrics.scalars = lambda prefix, values, step: scalars.append((prefix, step, values))
    straight = _trainer(parts, metrics)
    per_epoch = len(straight.parts.batches.samplers[0].batches(1))
    with caplog.at_level(logging.INFO, logger="mtrain"):
        for _ in range(per_epoch - 2):  # stopped two updates before the end of epoch 1
            straight.run_update()
        checkpoint = copy.deepcopy(straight.checkpoint_state())
        expected = [float(straight.run_update()["loss_sum"]) for _ in range(5)]  # across into epoch 2
    assert straight.state.epoch == 2
    resumed = _trainer(parts)
    resumed.load_state(checkpoint)
    assert [float(resumed.run_update()["loss_sum"]) for _ in range(5)] == expected

    lines = [r.getMessage() for r in caplog.records if " draw: " in r.getMessage()]
    assert [line.split(" draw")[0] for line in lines] == ["epoch 1", "epoch 2"]  # rank 0's, as each begins
    shares = straight.summary()["draw"]
    assert shares["epoch"] == 2 and sorted(shares["corpora"]) == ["c0", "c1", "c2"]
    mixture = straight.parts.batches.mixture
    assert [shares["corpora"][c]["pairs"] for c in ("c0", "c1", "c2")] == pytest.approx(
        (mixture.counts / mixture.counts.sum()).tolist(), abs=1e-6
    )
    assert f"c2 {100 * shares['corpora']['c2']['pairs']:.1f}% pairs" in lines[1]
    assert [(prefix, step) for prefix, step, _ in scalars] == [
        (f"draw/c{i}", update) for update in (1, per_epoch + 1) for i in range(3)
    ]
    assert scalars[-1][2] == shares["corpora"]["c2"]


TWO_CORPORA = "data.corpora=[{name: multi30k}, {name: bt, local_dir: /tmp/bt}]"


@pytest.mark.parametrize(
    "overrides, start",
    [
        (["data.sampling_temperature=0"], "data.sampling_temperature: 0.0 must be > 0"),
        (["data.sampling_temperature=-1"], "data.sampling_temperature: -1.0 must be > 0"),
        (
            [TWO_CORPORA, "data.subword_sampling.alpha=0.1"],
            "data.subword_sampling.alpha: subword sampling trains on one",
        ),
    ],
)
def test_what_a_mixture_cannot_draw_is_one_line_before_the_run_exists(overrides, start, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    status, lines = run_check("fit", [*overrides, f"hydra.run.dir={tmp_path / 'run'}"], capsys)
    assert_refused(status, lines, start)
    assert not (tmp_path / "run").exists()
