"""The training batches of each update: the same ones with and without background collation,
epochs on the right segmentation, resumable from the TrainState's position."""

from __future__ import annotations

import numpy as np
import torch

from mtrain.batches.corpus import EncodedCorpus
from mtrain.tokenizer import SpecialIds
from mtrain.train.batch_source import BatchSource
from mtrain.train.progress import TrainState

IDS = SpecialIds(unk=0, pad=1, bos=2, eos=3)


def _synthetic_corpus(sentences=300, seed=0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, 20, sentences)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    tokens = rng.integers(4, 50, int(offsets[-1]))
    return EncodedCorpus(tokens, offsets, (tokens * 7) % 46 + 4, offsets.copy())


def _source(corpora, prefetch=False, update_freq=1, max_epochs=None, pad_to_multiple=1):
    return BatchSource(
        corpora,
        IDS,
        torch.device("cpu"),
        max_tokens=200,
        update_freq=update_freq,
        max_epochs=max_epochs,
        seed=1,
        pad_to_multiple=pad_to_multiple,
        prefetch=prefetch,
    )


def _as_lists(batches):
    return [(b.src_tokens.tolist(), b.tgt_input.tolist(), b.tgt_output.tolist()) for b in batches]


def test_prefetched_batches_are_the_batches_the_trainer_would_have_collated():
    """The background collation (on by default on CUDA) changes when a batch is made, never
    which: the same batches in the same order across epochs, with gradient accumulation."""
    corpus = _synthetic_corpus()
    sequences = {}
    for prefetch in (False, True):
        source, state = _source([corpus], prefetch=prefetch, update_freq=2, pad_to_multiple=4), TrainState()
        assert (source._prefetcher is not None) == prefetch
        seen = []
        while state.epoch <= 3:
            seen.append(_as_lists(source.next_update(state)))
        sequences[prefetch] = seen
    assert len(sequences[True]) > 20 and sequences[True] == sequences[False]


def _corpus(length: int, sentences: int = 120) -> EncodedCorpus:
    """Every sentence `length` tokens of one id per corpus: the batch says which corpus it came from."""
    return EncodedCorpus.from_sequences(
        [[length + 10] * (length - 1) + [3]] * sentences, [[length + 10] * length] * sentences
    )


def test_epoch_e_trains_on_copy_e_minus_1_mod_copies():
    copies = [_corpus(5), _corpus(7)]
    for prefetch in (False, True):
        source, state = _source(copies, prefetch=prefetch), TrainState()
        seen = {}
        while state.epoch <= 3:
            (batch,) = source.next_update(state)
            seen.setdefault(state.epoch, set()).update(batch.tgt_output[:, 0].tolist())
        assert seen == {1: {15}, 2: {17}, 3: {15}, 4: {17}}  # epoch 4: its first batch only


def test_a_source_continues_from_a_saved_position_batch_for_batch():
    """What a resume relies on: a new source given the saved (epoch, batch) yields what the
    first would have yielded next."""
    corpus = _synthetic_corpus()
    source, state = _source([corpus]), TrainState()
    for _ in range(25):  # into the second epoch
        source.next_update(state)
    saved = TrainState(epoch=state.epoch, batch_in_epoch=state.batch_in_epoch)
    expected = [_as_lists(source.next_update(state)) for _ in range(10)]
    resumed = _source([corpus])
    assert [_as_lists(resumed.next_update(saved)) for _ in range(10)] == expected


def test_max_epochs_ends_the_batches_and_an_update_takes_what_its_epoch_has_left():
    corpus = _synthetic_corpus(sentences=60)
    source, state = _source([corpus], update_freq=3, max_epochs=2), TrainState()
    per_epoch = len(source.samplers[0].batches(1))
    sizes = []
    while (batches := source.next_update(state)) is not None:
        sizes.append(len(batches))
    assert state.epoch == 2
    assert sum(sizes) == per_epoch + len(source.samplers[0].batches(2))
    assert max(sizes) == 3 and all(size >= 1 for size in sizes)


def test_under_ddp_each_batch_carries_the_token_counts_of_its_position_on_every_rank():
    """What the loss of a DDP update is normalised by, known without a collective: each rank's
    batch counts its own tokens and its peer's at the same position, across epochs, with
    accumulation, with shape buckets' dummy rows (which count nothing)."""
    corpus = _synthetic_corpus()
    for buckets in (0, 3):
        sources = [
            BatchSource(
                [corpus],
                IDS,
                torch.device("cpu"),
                max_tokens=200,
                update_freq=2,
                max_epochs=2,
                seed=1,
                pad_to_multiple=4,
                shape_buckets=buckets,
                num_replicas=2,
                rank=rank,
            )
            for rank in range(2)
        ]
        states, updates = [TrainState(), TrainState()], 0
        while (ranks := [source.next_update(state) for source, state in zip(sources, states, strict=True)])[
            0
        ] is not None:
            updates += 1
            for mine, other in zip(*ranks, strict=True):
                for batch in (mine, other):
                    assert batch.job_num_tgt_tokens == mine.num_tgt_tokens + other.num_tgt_tokens
                    assert batch.job_num_src_tokens == mine.num_src_tokens + other.num_src_tokens
        assert updates > 10 and ranks[1] is None
    alone = _source([corpus]).next_update(TrainState())[0]
    assert alone.job_num_tgt_tokens is None  # one process: its own counts are the job's
