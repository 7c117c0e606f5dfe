"""The library's entry points take config dataclasses and OmegaConf nodes alike.

`mtrain fit` hands them the sections of the Hydra-composed config (DictConfig nodes); the
typed path hands them `OmegaConf.to_object` of that config (FitConfig and its section
dataclasses, choices as Enum members); library users also build the dataclasses by hand,
where a choice may be its plain string. All three must give the same result: the same
cache entries from `prepare_data`, the same parameters from `build_model`, the same
CTranslate2 spec from the exporter.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from mtrain.batches.prepare import prepare_data
from mtrain.cli.common import CONFIG_DIR
from mtrain.config import DataConfig, FitConfig, ModelConfig, Positions, TokenizerConfig
from mtrain.errors import MtrainError
from mtrain.model import build_model

TINY_MODEL = ["model.layers=1", "model.d_model=16", "model.heads=2", "model.ffn_dim=32"]
# The defaults, and every choice the model's construction branches on set to another value.
VARIANTS = {
    "defaults": [],
    "switched": [
        "model.positions=rope",
        "model.activation=swiglu",
        "model.norm_type=rmsnorm",
        "model.norm_position=post",
        "model.decoder_order=cross_self_ffn",
        "model.output_vocab=target",
        "model.attention_impl=math",
    ],
    "learned_normalized": [
        "model.positions=learned",
        "model.activation=gelu",
        "model.residual_input=normalized",
        "model.tie_embeddings=false",
    ],
}
VOCAB, PAD = 30, 1


def composed(overrides: list[str]) -> DictConfig:
    """The FitConfig `mtrain fit <overrides>` composes."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose(config_name="fit", overrides=overrides)


def test_the_typed_config_is_dataclasses_with_enum_members():
    typed = OmegaConf.to_object(composed(["model.positions=rope"]))
    assert isinstance(typed, FitConfig) and isinstance(typed.data, DataConfig)
    assert isinstance(typed.tokenizer, TokenizerConfig) and isinstance(typed.model, ModelConfig)
    assert typed.model.positions is Positions.rope


def test_prepare_data_gives_the_same_cache_entries_for_both(multi30k_slice, tmp_path):
    node = composed(
        [
            f"data.local_dir={multi30k_slice}",
            f"data.cache_dir={tmp_path}",
            "data.train_limit=500",
            "data.clean.normalize=NFKC",
            "data.subword_sampling.alpha=0.1",
            "data.subword_sampling.copies=1",
            "tokenizer.vocab_size=400",
        ]
    )
    typed = OmegaConf.to_object(node)

    def silent(_message: str) -> None:
        pass

    from_dataclasses = prepare_data(typed.data, typed.tokenizer, log=silent)
    messages: list[str] = []
    from_node = prepare_data(node.data, node.tokenizer, log=messages.append)

    # The node's run finds everything the dataclasses' run built: tokenizer, corpus, sampled copy.
    assert any(m.startswith("tokenizer: reusing") for m in messages), messages
    assert any("cache hit, reusing the encoded corpus" in m for m in messages), messages
    assert any("cache hit, reusing 1 sampled segmentations" in m for m in messages), messages
    assert from_node.fingerprint == from_dataclasses.fingerprint
    assert from_node.directory == from_dataclasses.directory
    assert from_node.tokenizer.fingerprint == from_dataclasses.tokenizer.fingerprint
    assert len(from_node.train) == len(from_dataclasses.train) == 500
    assert np.array_equal(from_node.train_copies[0].tgt_tokens, from_dataclasses.train_copies[0].tgt_tokens)


def test_prepare_data_refuses_bad_choices_of_hand_built_dataclasses(multi30k_slice, tmp_path):
    # Hydra refuses these at composition; a dataclass built by hand reaches the library's checks.
    data = DataConfig(local_dir=str(multi30k_slice), cache_dir=str(tmp_path))
    with pytest.raises(MtrainError, match="tokenizer.model_type=word"):
        prepare_data(data, TokenizerConfig(vocab_size=400, model_type="word"), log=lambda _: None)
    with pytest.raises(MtrainError, match="data.format=xml"):
        prepare_data(DataConfig(local_dir=str(multi30k_slice), format="xml"), TokenizerConfig(), log=lambda _: None)


def _model(cfg, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(cfg, VOCAB, VOCAB, PAD, joint_vocab=True)


@pytest.mark.parametrize("variant", VARIANTS)
def test_build_model_gives_the_same_model_for_node_dataclass_and_plain_strings(variant):
    node = composed(TINY_MODEL + VARIANTS[variant]).model
    typed = OmegaConf.to_object(node)
    # By hand, as a library user writes it: choices as plain strings.
    by_hand = ModelConfig(**OmegaConf.to_container(node, enum_to_str=True))
    assert isinstance(by_hand.positions, str) and not isinstance(by_hand.positions, Positions)

    reference = _model(node)
    source = torch.randint(4, VOCAB, (2, 5))
    target = torch.randint(4, VOCAB, (2, 4))
    padding = torch.zeros(2, 5, dtype=torch.bool)
    expected = reference.eval()(source, padding, target)
    for cfg in (typed, by_hand):
        model = _model(cfg)
        state, reference_state = model.state_dict(), reference.state_dict()
        assert list(state) == list(reference_state)
        assert all(torch.equal(state[name], reference_state[name]) for name in state)
        assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in reference.parameters())
        assert [type(m).__name__ for m in model.modules()] == [type(m).__name__ for m in reference.modules()]
        assert torch.equal(model.eval()(source, padding, target), expected)


@pytest.mark.parametrize("variant", ["defaults", "switched"])
def test_the_exporter_builds_the_same_spec_for_both(variant):
    pytest.importorskip("ctranslate2")
    from mtrain.export.ctranslate2_spec import build_spec

    overrides = [item for item in VARIANTS[variant] if "decoder_order" not in item]  # CTranslate2 has one order
    node = composed(TINY_MODEL + overrides).model
    state = _model(node).state_dict()
    pieces = ["<unk>", "<pad>", "<s>", "</s>"] + [f"p{i}" for i in range(VOCAB - 4)]
    special = {"unk": "<unk>", "bos": "<s>", "eos": "</s>", "pad": "<pad>"}

    def spec_of(cfg):
        spec = build_spec(state, cfg, pieces, pieces, special)
        return vars(spec.config), {name: value.numpy() for name, value in spec.variables().items()}

    expected_config, expected_variables = spec_of(node)
    for cfg in (OmegaConf.to_object(node), ModelConfig(**OmegaConf.to_container(node, enum_to_str=True))):
        config, variables = spec_of(cfg)
        assert config == expected_config
        assert list(variables) == list(expected_variables)
        assert all(np.array_equal(variables[name], expected_variables[name]) for name in variables)


def test_check_exportable_refuses_alike():
    from mtrain.export import check_exportable

    node = composed(TINY_MODEL + ["model.decoder_order=cross_self_ffn"]).model
    for cfg in (node, OmegaConf.to_object(node), ModelConfig(decoder_order="cross_self_ffn")):
        with pytest.raises(MtrainError, match="model.decoder_order=cross_self_ffn"):
            check_exportable(cfg)
