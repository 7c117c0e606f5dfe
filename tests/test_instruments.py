"""The ablation bench's instruments in a real `run_fit`: the TensorBoard tags they write,
exactly-zero encoder gradients with `model.detach_memory=true`, and nothing when off."""

from __future__ import annotations

import math

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from mtrain.cli.fit import run_fit
from tests.fit_runs import TINY, compose_fit

LAYERS = 2  # TINY's encoder and decoder depth
SUBLAYER_STATS = ("input_mean", "input_std", "output_std")


def expected_tags() -> set[str]:
    grad_norm = {"encoder.embeddings", "decoder.embeddings", "encoder_norm", "decoder_norm"}
    activations = set()
    for i in range(LAYERS):
        grad_norm |= {f"encoder.{i}", f"decoder.{i}"}
        grad_norm |= {f"decoder.{i}.cross_attn.{p}_proj" for p in "qkv"}
        for stack, sublayers in (("encoder", ("self_attn", "ffn")), ("decoder", ("self_attn", "cross_attn", "ffn"))):
            activations |= {f"{stack}.{i}.residual_mean", f"{stack}.{i}.residual_std"}
            for sublayer in sublayers:
                activations |= {f"{stack}.{i}.{sublayer}.{stat}" for stat in SUBLAYER_STATS}
                if sublayer != "ffn":
                    activations.add(f"{stack}.{i}.{sublayer}.entropy")
    return {f"instruments/grad_norm/{name}" for name in grad_norm} | {
        f"instruments/activations/{name}" for name in activations
    }


@pytest.fixture(scope="module")
def fit(tmp_path_factory, multi30k_slice):
    """run_fit(extra overrides) -> {tag: {step: value}}; the runs share one data cache."""
    root = tmp_path_factory.mktemp("instruments")
    common = [
        f"data.local_dir={multi30k_slice}",
        f"data.cache_dir={root / 'cache'}",
        *TINY,
        "data.train_limit=300",
        "train.valid_bleu=false",
        "train.num_threads=1",
    ]

    def run(name: str, overrides: list[str]) -> dict[str, dict[int, float]]:
        run_dir = root / name
        run_fit(compose_fit(common + overrides), run_dir)
        events = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
        events.Reload()
        return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}

    return run


def test_instruments_write_their_tags_every_n_updates(fit):
    scalars = fit("on", ["train.instruments=true", "train.instrument_every=2", "train.max_updates=4"])
    instruments = {tag: values for tag, values in scalars.items() if tag.startswith("instruments/")}
    missing = expected_tags() - instruments.keys()
    assert not missing, sorted(missing)
    for tag, values in instruments.items():
        assert set(values) == {2, 4}, tag
        assert all(math.isfinite(v) for v in values.values()), tag
    for name in (
        "encoder.embeddings",
        "encoder.0",
        "encoder.1",
        "decoder.0.cross_attn.k_proj",
        "decoder.1.cross_attn.v_proj",
    ):
        assert all(v > 0 for v in instruments[f"instruments/grad_norm/{name}"].values()), name
    for tag in instruments:
        if tag.endswith(".entropy"):
            assert all(v >= 0 for v in instruments[tag].values()), tag


def test_detached_memory_gives_the_encoder_exactly_zero_gradient(fit):
    # Untied embeddings: a tied source embedding is also the decoder's and would still learn.
    scalars = fit(
        "detached",
        [
            "model.detach_memory=true",
            "model.tie_embeddings=false",
            "train.instruments=true",
            "train.instrument_every=2",
            "train.max_updates=2",
        ],
    )
    encoder = ["encoder.embeddings", "encoder_norm"] + [f"encoder.{i}" for i in range(LAYERS)]
    for name in encoder:
        assert scalars[f"instruments/grad_norm/{name}"] == {2: 0.0}, name
    for name in ("decoder.embeddings", "decoder.0", "decoder.0.cross_attn.k_proj", "output_proj"):
        assert scalars[f"instruments/grad_norm/{name}"][2] > 0, name


def test_no_instrument_tags_when_off(fit):
    scalars = fit("off", ["train.max_updates=2", "train.log_every=1", "train.loss_every=1"])
    assert "train/loss" in scalars
    assert not [tag for tag in scalars if tag.startswith("instruments/")]
