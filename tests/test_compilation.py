"""mtrain.train.compilation: the compiled update's modes, its refusal on a CPU, and a bound on
what torch.compile builds over a real epoch of Multi30k batches (dynamo's `eager` backend:
the guards and recompiles of the real thing, without code generation)."""

from __future__ import annotations

import functools
import logging

import pytest
import torch

from mtrain.config import TrainConfig
from mtrain.errors import MtrainError
from mtrain.train.compilation import GRAPHS_PER_BUCKET, compile_network, shape_buckets
from mtrain.train.setup import resolve_machine, setup_fit
from tests.fit_runs import compose_fit
from tests.synthetic_training import synthetic_trainer


def test_cuda_graphs_are_refused_on_a_cpu_in_one_line():
    with pytest.raises(MtrainError) as refusal:
        resolve_machine(compose_fit(["train.cuda_graphs=true", "train.device=cpu"]))
    message = str(refusal.value)
    assert message.startswith("train.cuda_graphs=true needs a CUDA device") and "\n" not in message


def test_one_key_chooses_compiled_or_graph_captured_and_the_shape_buckets_follow(monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "compile", lambda network, **options: calls.append(options) or network)
    network = torch.nn.Linear(2, 2)
    assert compile_network(network, TrainConfig()) is network and calls == []
    compile_network(network, TrainConfig(compile=True))
    compile_network(network, TrainConfig(cuda_graphs=True))
    compile_network(network, TrainConfig(compile=True, shape_buckets=0))
    # per shape with buckets (the default when compiling), dynamic without
    assert calls == [
        {"dynamic": False, "mode": None},
        {"dynamic": False, "mode": "reduce-overhead"},
        {"dynamic": True, "mode": None},
    ]
    assert torch._dynamo.config.recompile_limit >= 8 * GRAPHS_PER_BUCKET  # a graph kept for every bucket
    assert [shape_buckets(TrainConfig(**options)) for options in ({}, {"compile": True}, {"cuda_graphs": True})] == [
        0,
        8,
        8,
    ]
    assert shape_buckets(TrainConfig(compile=True, shape_buckets=0)) == 0  # a set value wins


def test_the_graph_captured_step_trains_as_the_plain_one(monkeypatch):
    """What train.cuda_graphs changes in the step, on a CPU without the capture itself: no token
    count reaches the network (the loss weights the pad rows), a step boundary is marked before
    each forward; the losses are the plain step's."""
    marks = []
    monkeypatch.setattr(torch, "compile", lambda network, **options: network)
    monkeypatch.setattr("mtrain.train.step.begin_graph_step", lambda: marks.append(1))
    plain, graphs = (
        synthetic_trainer(["train.shape_buckets=4"]),
        synthetic_trainer(["train.shape_buckets=4", "train.cuda_graphs=true"]),
    )
    assert graphs.parts.cuda_graphs and graphs.parts.network.static_rows and not plain.parts.network.static_rows
    for _ in range(3):
        assert float(plain.run_update()["loss_sum"]) == pytest.approx(float(graphs.run_update()["loss_sum"]), rel=1e-5)
    assert len(marks) == 3


@pytest.mark.slow
def test_an_epoch_of_multi30k_compiles_one_graph_per_batch_shape(tmp_path, data_dir, compiled_calls, caplog):
    """The whole of Multi30k's training split, batches of 16,384 tokens, train.compile=true (shape
    buckets on by default): 8 shapes, one static graph for each batch signature (its shape,
    and whether its sources are padded), none beyond."""
    cfg = compose_fit(
        [
            f"data.cache_dir={tmp_path / 'cache'}",
            "tokenizer.vocab_size=400",
            "tokenizer.max_sentences=4000",
            "model.encoder_layers=1",
            "model.decoder_layers=1",
            "model.d_model=8",
            "model.heads=1",
            "model.ffn_dim=16",
            "train.device=cpu",
            "train.precision=fp32",
            "train.max_tokens=16384",
            "train.max_epochs=1",
            "train.num_threads=1",  # a tiny model: a second thread only spins
            "train.compile=true",
        ]
    )
    caplog.set_level(logging.INFO, logger="mtrain")
    trainer = setup_fit(cfg).trainer
    updates = 0
    while trainer.run_update() is not None or not trainer.exhausted:
        updates += 1
    shapes = trainer.parts.batches.shapes_seen
    assert len(trainer.parts.batches.bucket_widths) == 8 and len(shapes) == 8
    assert updates == len(trainer.parts.batches.samplers[0].batches(1)) > 20
    assert trainer.graphs_built == len(set(compiled_calls)) >= 8
    assert trainer.summary()["compiled_graphs"] == trainer.graphs_built
    logged = caplog.text
    assert "batches: epoch 1 has" in logged and "in 8 shapes" in logged
    assert "torch.compile: update 1 built graph 1 (the first, batch " in logged


class _Recording(torch.nn.Module):
    """The compiled network, recording each call's signature: shapes, and whether the sources
    are padded (an unpadded batch's attention runs without a mask: a graph of its own)."""

    def __init__(self, compiled: torch.nn.Module, calls: list) -> None:
        super().__init__()
        self.compiled, self.calls = compiled, calls

    def forward(self, src_tokens, src_padding_mask, tgt_input, *rest):
        self.calls.append((tuple(src_tokens.shape), tuple(tgt_input.shape), src_padding_mask is None))
        return self.compiled(src_tokens, src_padding_mask, tgt_input, *rest)


@pytest.fixture
def compiled_calls(monkeypatch) -> list:
    """torch.compile with dynamo's `eager` backend (the guards and recompiles of the real thing,
    without code generation), the compiled network recording its calls' signatures."""
    calls: list = []
    compile_eagerly = functools.partial(torch.compile, backend="eager")
    monkeypatch.setattr(
        torch, "compile", lambda network, **options: _Recording(compile_eagerly(network, **options), calls)
    )
    torch._dynamo.reset()
    return calls


def test_each_bucket_compiles_once_and_the_second_epoch_compiles_nothing(tmp_path, multi30k_slice, compiled_calls):
    """With shape buckets each batch shape is compiled statically (kernels specialised to it,
    the loss chunked per bucket): two epochs of a Multi30k slice build one graph per batch
    signature (its bucket; and an unpadded batch, whose attention runs without a mask), all in
    the first epoch; the second epoch builds none."""
    calls = compiled_calls
    cfg = compose_fit(
        [
            f"data.local_dir={multi30k_slice}",
            f"data.cache_dir={tmp_path / 'cache'}",
            "tokenizer.vocab_size=300",
            "model.encoder_layers=1",
            "model.decoder_layers=1",
            "model.d_model=8",
            "model.heads=1",
            "model.ffn_dim=16",
            "train.device=cpu",
            "train.precision=fp32",
            "train.max_tokens=4096",
            "train.max_epochs=2",
            "train.num_threads=1",
            "train.compile=true",
            "train.shape_buckets=4",
        ]
    )
    trainer = setup_fit(cfg).trainer
    assert trainer.parts.network.compiled.static_rows  # the loss takes no per-batch token count
    after_update = []  # (epoch, graphs built, calls so far)
    while trainer.run_update() is not None:
        after_update.append((trainer.state.epoch, trainer.graphs_built, len(calls)))
    first_epoch = after_update[0][0]
    _, graphs_in_first_epoch, first_epoch_calls = [u for u in after_update if u[0] == first_epoch][-1]
    assert len(after_update) > first_epoch_calls > 10  # two epochs of several batches each
    assert len({shapes for shapes, _, _ in calls}) == len(trainer.parts.batches.bucket_widths) == 4
    assert graphs_in_first_epoch == trainer.graphs_built == len(set(calls[:first_epoch_calls])) == len(set(calls))
