"""The encoded on-disk corpus (mtrain.batches.corpus) and the cache's interruption safety."""

from __future__ import annotations

import os
import pickle
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from mtrain.batches.batching import TokenBatchSampler, collate
from mtrain.batches.corpus import CorpusWriter, EncodedCorpus, token_dtype
from mtrain.batches.prepare import prepare_data
from mtrain.config import DataConfig, TokenizerConfig
from mtrain.data.cache import COMPLETE_MARKER
from tests.warm_process import run_python

REPO = Path(__file__).resolve().parents[1]
EOS = 3


def random_pairs(n: int, vocab: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    src = [rng.integers(4, vocab, rng.integers(0, 40)).tolist() + [EOS] for _ in range(n)]
    tgt = [rng.integers(4, vocab, rng.integers(0, 40)).tolist() for _ in range(n)]  # empty ones too
    return src, tgt


def write_in_chunks(directory: Path, src, tgt, dtype, chunk: int = 97) -> None:
    writer = CorpusWriter(directory, dtype)
    for start in range(0, len(src), chunk):
        parts = []
        for side in (src, tgt):
            block = side[start : start + chunk]
            parts += [np.array([t for s in block for t in s], dtype=np.int64), np.array([len(s) for s in block])]
        writer.append(*parts)
    writer.close()


@pytest.mark.parametrize("vocab", [8000, 70000])
def test_memory_mapped_storage_round_trips_exactly(tmp_path, vocab):
    src, tgt = random_pairs(1000, vocab)
    dtype = token_dtype(vocab)
    assert dtype == (np.uint16 if vocab <= 65536 else np.int32)
    write_in_chunks(tmp_path / "train", src, tgt, dtype)
    corpus = EncodedCorpus.open(tmp_path / "train")
    assert isinstance(corpus.src_tokens, np.memmap) and corpus.src_tokens.dtype == dtype
    assert len(corpus) == 1000
    assert corpus.src_lengths.tolist() == [len(s) for s in src]
    assert corpus.tgt_lengths.tolist() == [len(t) for t in tgt]
    for i in range(1000):
        assert corpus.src(i).tolist() == src[i]
        assert corpus.tgt(i).tolist() == tgt[i]
    # Pickling (DataLoader workers) sends the path, not the arrays, and reopens the maps.
    state = pickle.dumps(corpus)
    assert len(state) < 1000
    again = pickle.loads(state)
    assert again.tgt(999).tolist() == tgt[999]


def test_loader_batches_equal_batches_from_in_memory_data(tmp_path):
    src, tgt = random_pairs(700, 8000, seed=1)
    write_in_chunks(tmp_path / "train", src, tgt, np.uint16)
    on_disk = EncodedCorpus.open(tmp_path / "train")
    in_memory = EncodedCorpus.from_sequences(src, tgt)
    sampler = TokenBatchSampler(on_disk.src_lengths, on_disk.tgt_lengths, max_tokens=300, seed=4)
    reference = TokenBatchSampler(in_memory.src_lengths, in_memory.tgt_lengths, max_tokens=300, seed=4)
    batches = sampler.batches(3)
    assert [b.tolist() for b in batches] == [b.tolist() for b in reference.batches(3)]
    for indices in batches:
        a = collate(on_disk, indices, 1, 2, EOS)
        b = collate(in_memory, indices, 1, 2, EOS)
        for name in ("src_tokens", "src_padding_mask", "tgt_input", "tgt_output", "indices"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
        assert (a.num_src_tokens, a.num_tgt_tokens) == (b.num_src_tokens, b.num_tgt_tokens)


# ------------------------------------------------------------------ interrupted preparation
KILL_AFTER_FIRST_CHUNK = textwrap.dedent(
    """
    import os, signal, sys
    from mtrain.config import DataConfig, TokenizerConfig
    from mtrain.batches.corpus import CorpusWriter
    from mtrain.batches.prepare import prepare_data

    append = CorpusWriter.append

    def append_then_die(self, *arrays):
        append(self, *arrays)
        os.kill(os.getpid(), signal.SIGKILL)  # as if the machine went away mid-way

    CorpusWriter.append = append_then_die
    data = DataConfig(local_dir=sys.argv[1], cache_dir=sys.argv[2], chunk_size=500)
    prepare_data(data, TokenizerConfig(vocab_size=500), log=lambda message: None)
    """
)


def slice_config(multi30k_slice: Path, cache: Path) -> DataConfig:
    return DataConfig(local_dir=str(multi30k_slice), cache_dir=str(cache), chunk_size=500)


def assert_same_corpus(a: EncodedCorpus, b: EncodedCorpus) -> None:
    assert np.array_equal(a.src_tokens, b.src_tokens) and np.array_equal(a.src_offsets, b.src_offsets)
    assert np.array_equal(a.tgt_tokens, b.tgt_tokens) and np.array_equal(a.tgt_offsets, b.tgt_offsets)


def test_a_killed_preparation_is_detected_and_rebuilt(multi30k_slice, tmp_path):
    cache = tmp_path / "cache"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = run_python("-c", KILL_AFTER_FIRST_CHUNK, str(multi30k_slice), str(cache), env=env, text=True, timeout=120)
    assert run.returncode == -9, run.stderr
    leftovers = list((cache / "corpora").iterdir())
    assert len(leftovers) == 1 and ".tmp-" in leftovers[0].name  # only the half-written build
    assert (leftovers[0] / "train" / "src.tokens").stat().st_size > 0  # the first chunk was written
    assert not (leftovers[0] / COMPLETE_MARKER).exists()

    messages = []
    prepared = prepare_data(slice_config(multi30k_slice, cache), TokenizerConfig(vocab_size=500), log=messages.append)
    assert any("interrupted preparation" in m and str(leftovers[0]) in m for m in messages)
    assert not leftovers[0].exists()
    assert len(prepared.train) == 2000 and (prepared.directory / COMPLETE_MARKER).exists()

    fresh = prepare_data(
        slice_config(multi30k_slice, tmp_path / "fresh"), TokenizerConfig(vocab_size=500), log=lambda m: None
    )
    assert_same_corpus(prepared.train, fresh.train)


def test_an_exception_mid_way_leaves_no_entry_and_an_unmarked_entry_is_rebuilt(multi30k_slice, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    calls = []
    append = CorpusWriter.append

    def append_then_fail(self, *arrays):
        append(self, *arrays)
        calls.append(1)
        raise KeyboardInterrupt  # Ctrl-C after the first chunk

    monkeypatch.setattr(CorpusWriter, "append", append_then_fail)
    with pytest.raises(KeyboardInterrupt):
        prepare_data(slice_config(multi30k_slice, cache), TokenizerConfig(vocab_size=500), log=lambda m: None)
    assert calls == [1] and list((cache / "corpora").iterdir()) == []
    monkeypatch.undo()

    prepared = prepare_data(slice_config(multi30k_slice, cache), TokenizerConfig(vocab_size=500), log=lambda m: None)
    (prepared.directory / COMPLETE_MARKER).unlink()  # e.g. a cache copied half way by hand
    messages = []
    again = prepare_data(slice_config(multi30k_slice, cache), TokenizerConfig(vocab_size=500), log=messages.append)
    assert any("incomplete" in m for m in messages) and (again.directory / COMPLETE_MARKER).exists()
    assert len(again.train) == 2000
