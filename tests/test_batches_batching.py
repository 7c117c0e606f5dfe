"""Token-budget batching and collation (mtrain.batches.batching)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mtrain.batches.batching import Batch, TokenBatchSampler, collate
from mtrain.batches.corpus import EncodedCorpus

PAD, BOS, EOS = 1, 2, 3


def random_corpus(n: int, seed: int = 0, max_len: int = 30) -> EncodedCorpus:
    rng = np.random.default_rng(seed)
    src = [list(rng.integers(4, 100, rng.integers(0, max_len))) + [EOS] for _ in range(n)]
    tgt = [list(rng.integers(4, 100, rng.integers(1, max_len))) for _ in range(n)]
    return EncodedCorpus.from_sequences(src, tgt)


def test_collate_teacher_forcing_padding_and_masks():
    corpus = EncodedCorpus.from_sequences(
        src=[[10, 11, EOS], [12, EOS], [13, 14, 15, 16, EOS]],
        tgt=[[20, 21], [22, 23, 24], [25]],
    )
    batch = collate(corpus, [0, 1, 2], PAD, BOS, EOS)
    assert batch.src_tokens.tolist() == [[10, 11, EOS, PAD, PAD], [12, EOS, PAD, PAD, PAD], [13, 14, 15, 16, EOS]]
    assert batch.src_padding_mask.tolist() == [
        [False, False, False, True, True],
        [False, False, True, True, True],
        [False, False, False, False, False],
    ]
    assert batch.tgt_input.tolist() == [[BOS, 20, 21, PAD], [BOS, 22, 23, 24], [BOS, 25, PAD, PAD]]
    assert batch.tgt_output.tolist() == [[20, 21, EOS, PAD], [22, 23, 24, EOS], [25, EOS, PAD, PAD]]
    assert batch.indices.tolist() == [0, 1, 2]
    assert batch.num_src_tokens == 10
    assert batch.num_tgt_tokens == 9  # y + eos per sentence
    assert batch.src_tokens.dtype == torch.int64 and batch.src_padding_mask.dtype == torch.bool


def test_padding_mask_is_none_only_for_a_batch_without_source_padding():
    corpus = EncodedCorpus.from_sequences(
        src=[[10, 11, EOS], [12, EOS], [13, 14, EOS]], tgt=[[20, 21], [22, 23, 24], [25]]
    )
    padded = collate(corpus, [0, 1], PAD, BOS, EOS)
    assert padded.src_padding_mask_or_none is padded.src_padding_mask
    unpadded = collate(corpus, [0, 2], PAD, BOS, EOS)  # both sources 3 tokens; targets still padded
    assert not unpadded.src_padding_mask.any() and unpadded.src_padding_mask_or_none is None
    assert collate(corpus, [0, 2], PAD, BOS, EOS, pad_to_multiple=4).src_padding_mask_or_none is not None
    dummy = collate(corpus, [0, 2, -1], PAD, BOS, EOS, bucket_widths=np.array([4]))  # a bucket's dummy row
    assert dummy.src_padding_mask_or_none is dummy.src_padding_mask


def test_collate_matches_a_plain_python_reference():
    corpus = random_corpus(200, seed=1)
    indices = np.array([5, 17, 3, 199, 42, 0])
    batch = collate(corpus, indices, PAD, BOS, EOS)
    width = max(len(corpus.src(i)) for i in indices)
    tgt_width = max(len(corpus.tgt(i)) for i in indices) + 1
    for row, i in enumerate(indices):
        src, tgt = corpus.src(i).tolist(), corpus.tgt(i).tolist()
        assert batch.src_tokens[row].tolist() == src + [PAD] * (width - len(src))
        assert batch.tgt_input[row].tolist() == [BOS] + tgt + [PAD] * (tgt_width - len(tgt) - 1)
        assert batch.tgt_output[row].tolist() == tgt + [EOS] + [PAD] * (tgt_width - len(tgt) - 1)
        assert batch.src_padding_mask[row].tolist() == [False] * len(src) + [True] * (width - len(src))


def test_batch_to_and_pin_memory_keep_contents():
    batch = collate(random_corpus(10), [1, 2, 3], PAD, BOS, EOS)
    moved = batch.to("cpu", non_blocking=True)
    pinned = batch.pin_memory()
    for other in (moved, pinned):
        assert isinstance(other, Batch)
        assert torch.equal(other.tgt_output, batch.tgt_output)
        assert other.num_tgt_tokens == batch.num_tgt_tokens
    assert len(batch) == 3


def batch_cost(sampler: TokenBatchSampler, batch: np.ndarray) -> int:
    return len(batch) * int(max(sampler.src_lengths[batch].max(), sampler.tgt_lengths[batch].max() + 1))


def test_batches_respect_budget_and_cover_every_index_once():
    corpus = random_corpus(3000, seed=2, max_len=60)
    sampler = TokenBatchSampler(corpus.src_lengths, corpus.tgt_lengths, max_tokens=500, seed=7)
    batches = sampler.batches(epoch=1)
    assert all(batch_cost(sampler, b) <= 500 for b in batches)
    everything = np.concatenate(batches)
    assert sorted(everything.tolist()) == list(range(3000))
    # Batches are length-homogeneous: little padding overall.
    padded = sum(batch_cost(sampler, b) for b in batches)
    assert padded < 1.5 * sampler.sizes.sum()
    # The collated tensors obey the same budget.
    for b in batches[:20]:
        tensors = collate(corpus, b, PAD, BOS, EOS)
        assert len(b) * max(tensors.src_tokens.shape[1], tensors.tgt_input.shape[1]) <= 500


def test_an_over_long_sentence_gets_a_batch_of_its_own():
    src = np.array([5, 5, 400, 5, 5])
    tgt = np.array([4, 4, 4, 4, 4])
    batches = TokenBatchSampler(src, tgt, max_tokens=100, seed=0).batches(0)
    assert [2] in [b.tolist() for b in batches]
    assert sorted(np.concatenate(batches).tolist()) == [0, 1, 2, 3, 4]


def test_epochs_shuffle_differently_but_deterministically():
    corpus = random_corpus(2000, seed=3)

    def make(seed: int) -> TokenBatchSampler:
        return TokenBatchSampler(corpus.src_lengths, corpus.tgt_lengths, max_tokens=400, seed=seed)

    first, again = make(1).batches(1), make(1).batches(1)
    assert [b.tolist() for b in first] == [b.tolist() for b in again]
    second_epoch = make(1).batches(2)
    assert [b.tolist() for b in first] != [b.tolist() for b in second_epoch]
    assert [b.tolist() for b in make(2).batches(1)] != [b.tolist() for b in first]


def test_without_shuffle_batches_come_in_length_order():
    corpus = random_corpus(500, seed=4)
    sampler = TokenBatchSampler(corpus.src_lengths, corpus.tgt_lengths, max_tokens=300, seed=0, shuffle=False)
    order = np.concatenate(sampler.batches(0))
    width = np.maximum(corpus.src_lengths, corpus.tgt_lengths + 1)[order]
    assert np.all(np.diff(width) >= 0)
    same_width = np.diff(width) == 0  # within a width: target length, then source length
    tgt = corpus.tgt_lengths[order]
    assert np.all(np.diff(tgt)[same_width] >= 0)
    assert np.all(np.diff(corpus.src_lengths[order])[same_width & (np.diff(tgt) == 0)] >= 0)
    assert [b.tolist() for b in sampler.batches(0)] == [b.tolist() for b in sampler.batches(5)]


def _padded_and_real(batches, src_lengths, tgt_lengths):
    padded = sum(len(b) * (src_lengths[b].max() + tgt_lengths[b].max()) for b in batches)
    return padded, int(src_lengths.sum() + tgt_lengths.sum())


def test_width_first_order_pads_less_than_source_first():
    # A translation corpus: target lengths follow the source's. Sorting by source length
    # alone leaves the targets of a batch ragged; sorting by the width the budget counts,
    # then target and source, pads both sides little and fills the budget tighter.
    rng = np.random.default_rng(0)
    src = rng.integers(4, 40, 6000)
    tgt = np.clip(np.round(src * rng.normal(0.95, 0.15, 6000)), 1, None).astype(np.int64)
    sampler = TokenBatchSampler(src, tgt, max_tokens=1024, seed=1)
    width_first = sampler.batches(1)
    source_first = _source_first_batches(src, tgt, 1024)
    padded, real = _padded_and_real(width_first, src, tgt + 1)
    padded_before, _ = _padded_and_real(source_first, src, tgt + 1)
    assert padded - real < 0.8 * (padded_before - real)  # here 4.3% padding against 5.9%
    assert len(width_first) < len(source_first)  # 137 batches against 146


def _source_first_batches(src, tgt, max_tokens):
    """The sampler's batches before: cut from the order sorted by source, then target length."""
    from mtrain.batches.batching import _budget_bounds

    order = np.lexsort([tgt, src])
    return np.split(order, _budget_bounds(np.maximum(src, tgt + 1)[order], max_tokens)[1:-1])


def test_ddp_ranks_get_disjoint_batches_of_equal_count():
    corpus = random_corpus(2500, seed=5)
    world = 3
    for epoch in (1, 2):
        per_rank = [
            TokenBatchSampler(corpus.src_lengths, corpus.tgt_lengths, 400, seed=9, num_replicas=world, rank=r).batches(
                epoch
            )
            for r in range(world)
        ]
        assert len({len(batches) for batches in per_rank}) == 1
        seen = np.concatenate([np.concatenate(batches) for batches in per_rank])
        assert len(seen) == len(set(seen.tolist()))  # disjoint
        full = TokenBatchSampler(corpus.src_lengths, corpus.tgt_lengths, 400, seed=9).batches(epoch)
        assert len(full) - len(per_rank[0]) * world < world  # only the remainder is dropped


def test_bad_sampler_arguments():
    with pytest.raises(ValueError):
        TokenBatchSampler(np.array([3]), np.array([3]), max_tokens=0, seed=0)
    with pytest.raises(ValueError):
        TokenBatchSampler(np.array([3]), np.array([3]), max_tokens=10, seed=0, num_replicas=2, rank=2)
    assert TokenBatchSampler(np.array([], dtype=int), np.array([], dtype=int), 10, 0).batches(0) == []


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(1, 80), st.integers(0, 80)), min_size=1, max_size=300),
    max_tokens=st.integers(1, 2000),
    epoch=st.integers(0, 5),
)
def test_budget_and_coverage_hold_for_any_lengths(lengths, max_tokens, epoch):
    src = np.array([s for s, _ in lengths])
    tgt = np.array([t for _, t in lengths])
    sampler = TokenBatchSampler(src, tgt, max_tokens=max_tokens, seed=3)
    batches = sampler.batches(epoch)
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or batch_cost(sampler, b) <= max_tokens


def batch_shapes(corpus: EncodedCorpus, batches, multiple: int) -> set:
    shapes = set()
    for b in batches:
        tensors = collate(corpus, b, PAD, BOS, EOS, pad_to_multiple=multiple)
        assert tensors.src_tokens.shape == tensors.src_padding_mask.shape
        shapes.add((len(b), tensors.src_tokens.shape[1], tensors.tgt_input.shape[1]))
    return shapes


def test_pad_to_multiple_rounds_lengths_and_keeps_contents():
    corpus = random_corpus(50, seed=6)
    plain = collate(corpus, [3, 7, 9], PAD, BOS, EOS)
    padded = collate(corpus, [3, 7, 9], PAD, BOS, EOS, pad_to_multiple=8)
    for name in ("src_tokens", "tgt_input", "tgt_output"):
        wide, narrow = getattr(padded, name), getattr(plain, name)
        assert wide.shape[1] % 8 == 0 and wide.shape[1] - narrow.shape[1] < 8
        assert torch.equal(wide[:, : narrow.shape[1]], narrow) and (wide[:, narrow.shape[1] :] == PAD).all()
    assert padded.src_padding_mask[:, plain.src_tokens.shape[1] :].all()
    assert (padded.num_src_tokens, padded.num_tgt_tokens) == (plain.num_src_tokens, plain.num_tgt_tokens)


def test_bucketed_epochs_have_few_shapes_whatever_the_corpus_size():
    """The number of batch shapes is bounded by the length range, not by the corpus size."""
    counts = {}
    for n in (3000, 20000):
        corpus = random_corpus(n, seed=8, max_len=40)
        for multiple in (1, 8):
            sampler = TokenBatchSampler(
                corpus.src_lengths, corpus.tgt_lengths, max_tokens=1024, seed=1, pad_to_multiple=multiple
            )
            batches = sampler.batches(1)
            assert sorted(np.concatenate(batches).tolist()) == list(range(n))
            for b in batches[:50]:  # the budget holds for the padded tensors
                tensors = collate(corpus, b, PAD, BOS, EOS, pad_to_multiple=multiple)
                assert len(b) * max(tensors.src_tokens.shape[1], tensors.tgt_input.shape[1]) <= 1024
            counts[n, multiple] = len(batch_shapes(corpus, batches, multiple))
    # lengths up to 41 in 8-wide groups: at most 6 widths, each with its (src, tgt) roundings
    # and one count for full batches, plus one partial batch per group
    assert counts[3000, 8] <= 6 * 11 + 6 and counts[20000, 8] <= 6 * 11 + 6
    assert counts[20000, 8] < counts[20000, 1] / 3


def test_automatic_pad_multiple_per_device_and_precision():
    """train.pad_to_multiple=null: bf16 on a CPU pads to 4 (fewer shapes, less memory), fp32
    on a CPU not at all (padding costs FLOPs there), CUDA to 8; a set value always wins."""
    import torch

    from mtrain.config import Precision
    from mtrain.train.builders import batch_pad_multiple

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert batch_pad_multiple(None, cpu, Precision.bf16) == 4
    assert batch_pad_multiple(None, cpu, Precision.fp32) == 1
    assert batch_pad_multiple(None, cuda, Precision.bf16) == 8 and batch_pad_multiple(None, cuda, Precision.fp32) == 8
    assert batch_pad_multiple(2, cpu, Precision.fp32) == 2
    # shape buckets bound the shapes themselves: widths of any size
    assert batch_pad_multiple(None, cuda, Precision.bf16, bucketed=True) == 1
    assert batch_pad_multiple(8, cuda, Precision.bf16, bucketed=True) == 8
