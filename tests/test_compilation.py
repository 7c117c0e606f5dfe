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
from mtrain.train.compilation import compile_network, shape_buckets
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
    assert calls == [{"dynamic": True, "mode": None}, {"dynamic": True, "mode": "reduce-overhead"}]
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
def test_an_epoch_of_multi30k_compiles_one_graph_in_at_most_eight_batch_shapes(tmp_path, data_dir, monkeypatch, caplog):
    """The whole of Multi30k's training split, batches of 16,384 tokens, train.compile=true (shape
    buckets on by default): at most 8 shapes, and one graph with at most one recompile
    (measured: one graph, no recompile)."""
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    torch._dynamo.reset()
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
    assert 1 <= trainer.graphs_built <= 2
    assert trainer.summary()["compiled_graphs"] == trainer.graphs_built
    logged = caplog.text
    assert "batches: epoch 1 has" in logged and "in 8 shapes" in logged
    assert "torch.compile: update 1 built graph 1 (the first, batch " in logged
