"""mtrain.hydra_internals: what mtrain relies on in Hydra's private API and error texts.

Each test pins one behaviour of the installed Hydra/OmegaConf that the checks before a run
(mtrain.cli.common) depend on. A Hydra or OmegaConf upgrade that changes one fails here, by
name, instead of silently letting a bad override through to the run.
"""

from __future__ import annotations

import pytest
from omegaconf import DictConfig, OmegaConf

from mtrain.cli.common import CONFIG_DIR
from mtrain.config import Activation, FitConfig, ModelConfig
from mtrain.hydra_internals import (
    BASIC_SWEEPER,
    CommandLine,
    ErrorKind,
    compose_jobs,
    has_primary_config,
    primary_configs,
    read_command_line,
    read_composition_error,
    tell_hydra_the_mode,
)


# ----------------------------------------------------------------------------- the command line
def test_the_command_line_as_hydras_parser_reads_it():
    assert read_command_line(["train.lr=1", "model=transformer_base"]) == CommandLine(
        ["train.lr=1", "model=transformer_base"], multirun=False, prints_config=False, hydra_only=False
    )
    assert read_command_line(["-m", "train.lr=1,2"]) == CommandLine(["train.lr=1,2"], True, False, False)
    assert read_command_line(["--multirun", "train.lr=1,2"]).multirun
    assert read_command_line(["--cfg", "job", "train.lr=1"]) == CommandLine(
        ["train.lr=1"], False, True, False, printed_part="job"
    )
    assert read_command_line(["--cfg", "all"]).printed_part == "all"


@pytest.mark.parametrize(
    "flags",
    [
        ["--help"],
        ["--hydra-help"],
        ["--info", "config"],
        ["-sc", "install=bash"],
        ["--config-name", "other"],
        ["--config-path", "elsewhere"],
        ["--config-dir", "/tmp"],
        ["--experimental-rerun", "config.pickle"],
    ],
)
def test_flags_that_compose_nothing_of_ours_are_left_to_hydra(flags):
    assert read_command_line([*flags, "train.lr=1"]).hydra_only


# ----------------------------------------------------------------------------- composition
def test_a_run_is_one_job_with_its_hydra_section():
    ((label, cfg),) = compose_jobs(CONFIG_DIR, "fit", ["train.lr=0.25", "hydra.run.dir=/tmp/r"], multirun=False)
    assert label == ""
    assert OmegaConf.get_type(cfg) is FitConfig
    assert cfg.train.lr == 0.25
    assert cfg.hydra.run.dir == "/tmp/r"


def test_a_sweep_is_its_base_config_and_every_job_of_the_basic_sweeper():
    jobs = compose_jobs(CONFIG_DIR, "fit", ["model.dropout=0.1,0.3", "train.lr=1e-3,2e-3"], multirun=True)
    labels = [label for label, _ in jobs]  # each job's overrides, as Hydra writes the values
    assert labels == [
        "",
        "model.dropout=0.1 train.lr=0.001",
        "model.dropout=0.1 train.lr=0.002",
        "model.dropout=0.3 train.lr=0.001",
        "model.dropout=0.3 train.lr=0.002",
    ]
    assert [(cfg.model.dropout, cfg.train.lr) for _, cfg in jobs[1:]] == [
        (0.1, 1e-3),
        (0.1, 2e-3),
        (0.3, 1e-3),
        (0.3, 2e-3),
    ]
    # compose_jobs expands a sweep only for Hydra's basic sweeper, known by this name.
    assert OmegaConf.select(jobs[0][1], "hydra.sweeper._target_") == BASIC_SWEEPER


def test_a_presets_sweeper_params_are_swept():
    jobs = compose_jobs(CONFIG_DIR, "fit", ["experiment=ablation_activation"], multirun=True)
    assert [cfg.model.activation for _, cfg in jobs[1:]] == [Activation.relu, Activation.gelu, Activation.swiglu]
    assert jobs[1][0] == "model.activation=relu experiment=ablation_activation"


def test_composing_leaves_no_global_hydra_behind():
    from hydra.core.global_hydra import GlobalHydra

    compose_jobs(CONFIG_DIR, "fit", [], multirun=False)
    assert not GlobalHydra.instance().is_initialized()


# ----------------------------------------------------------------------------- error texts
def hydras_own_mode(config_name: str, overrides: list[str]):
    """What Hydra.get_mode answers, composing (as Hydra does before every run)."""
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_automatic_config_search_path
    from hydra.core.global_hydra import GlobalHydra

    hydra = Hydra.create_main_hydra2(config_name, create_automatic_config_search_path(None, None, CONFIG_DIR))
    try:
        get_mode = getattr(Hydra.get_mode, "__wrapped__", Hydra.get_mode)
        return get_mode(hydra, config_name, list(overrides))
    finally:
        GlobalHydra.instance().clear()


@pytest.mark.parametrize(
    "overrides, multirun",
    [
        ([], False),
        (["train.lr=1e-3"], False),
        (["hydra.mode=MULTIRUN", "train.lr=1e-3,2e-3"], False),
        (["hydra.mode=RUN"], False),
        (["train.lr=1e-3,2e-3"], True),
    ],
)
def test_the_mode_mtrains_composition_reads_is_the_one_hydra_composes_to_read(overrides, multirun):
    """mtrain tells Hydra the `hydra.mode` of its own composition (the base config of a
    sweep), sparing Hydra's composition for it; both must read the same mode."""
    if "hydra.mode=MULTIRUN" in overrides:  # a sweep by the config's mode: composed as one, as with -m
        multirun = True
    [(_, base), *_] = compose_jobs(CONFIG_DIR, "fit", overrides, multirun)
    assert OmegaConf.select(base, "hydra.mode") == hydras_own_mode("fit", overrides)


def test_hydra_takes_the_told_mode_once_for_those_overrides_and_composes_otherwise(monkeypatch):
    from hydra._internal.hydra import Hydra
    from hydra.types import RunMode

    tell_hydra_the_mode("fit", ["train.lr=1e-3"], RunMode.MULTIRUN)
    composed = []
    monkeypatch.setattr(Hydra, "compose_config", lambda self, *args, **kwargs: composed.append(args) or None)
    hydra = object.__new__(Hydra)
    assert Hydra.get_mode(hydra, "fit", ["train.lr=1e-3"]) == RunMode.MULTIRUN and composed == []
    assert Hydra.get_mode(hydra, "fit", ["train.lr=1e-3"]) is None and len(composed) == 1  # told once
    assert Hydra.get_mode(hydra, "fit", ["train.lr=2e-3"]) is None and len(composed) == 2  # not told


def composition_error(overrides, multirun=False):
    with pytest.raises(Exception) as raised:
        compose_jobs(CONFIG_DIR, "fit", overrides, multirun)
    return read_composition_error(raised.value)


def test_a_missing_preset_names_its_group_and_the_presets():
    read = composition_error(["model=transfomer"])
    assert (read.kind, read.key, read.value) == (ErrorKind.MISSING_PRESET, "model", "transfomer")
    assert "transformer_small" in read.allowed and "transformer_base" in read.allowed


def test_an_unknown_key_is_named():
    # (`+train.max_tokes=1` composes: Hydra appends it; mtrain.config_checks refuses it.)
    for override, key in (("train.max_tokes=1", "train.max_tokes"), ("trian.lr=1", "trian.lr")):
        read = composition_error([override])
        assert (read.kind, read.key) == (ErrorKind.UNKNOWN_KEY, key), override


def test_a_value_outside_a_choice_names_the_choices():
    read = composition_error(["model.activation=rleu"])
    assert (read.kind, read.key, read.value, read.allowed) == (
        ErrorKind.NOT_A_CHOICE,
        "model.activation",
        "rleu",
        ("relu", "gelu", "silu", "swiglu"),
    )


def test_a_value_of_the_wrong_type_names_the_type():
    read = composition_error(["train.lr=fast"])
    assert (read.kind, read.key, read.value, read.allowed) == (
        ErrorKind.NOT_CONVERTIBLE,
        "train.lr",
        "fast",
        ("Float",),
    )
    read = composition_error(["train.max_tokens=many"])
    assert (read.kind, read.key, read.value, read.allowed) == (
        ErrorKind.NOT_CONVERTIBLE,
        "train.max_tokens",
        "many",
        ("Integer",),
    )


def test_a_bad_boolean_is_another_error_about_its_key():
    read = composition_error(["model.final_norm=maybe"])
    assert (read.kind, read.key) == (ErrorKind.OTHER_VALUE, "model.final_norm")
    assert "maybe" in read.detail


def test_several_values_without_m():
    read = composition_error(["train.max_tokens=1,2"])
    assert (read.kind, read.key, read.value) == (ErrorKind.SEVERAL_VALUES, "train.max_tokens", "1,2")


def test_a_word_that_is_no_override():
    read = composition_error(["foo"])
    assert (read.kind, read.key) == (ErrorKind.NOT_AN_OVERRIDE, "foo")
    assert read.detail  # the parser's reason, on Hydra's second line


def test_a_character_the_grammar_reads_only_quoted_is_named():
    read = composition_error(["hydra.run.dir=/tmp/r\u00fcns"])
    assert (read.kind, read.key, read.value, read.detail) == (
        ErrorKind.NEEDS_QUOTES,
        "hydra.run.dir",
        "/tmp/r\u00fcns",
        "\u00fc",
    )
    ((_, cfg),) = compose_jobs(CONFIG_DIR, "fit", ["hydra.run.dir='/tmp/r\u00fcns'"], multirun=False)
    assert cfg.hydra.run.dir == "/tmp/r\u00fcns"  # quoted, it is a value


def test_primary_configs_are_the_commands_configs():
    assert {"fit", "translate", "eval"} <= set(primary_configs(CONFIG_DIR))
    assert not [name for name in primary_configs(CONFIG_DIR) if name.endswith("_schema")]
    assert has_primary_config(CONFIG_DIR, "fit") and not has_primary_config(CONFIG_DIR, "fitt")
    assert read_command_line(["--config-name", "fitt"]).config_name == "fitt"
    assert read_command_line(["--config-name", "x", "--config-dir", "/tmp"]).config_name is None  # not ours


def test_an_error_it_cannot_read_keeps_hydras_first_line():
    read = read_composition_error(RuntimeError("something new\nand more"))
    assert (read.kind, read.detail) == (ErrorKind.UNREAD, "something new")


# ----------------------------------------------------------------------------- node access
def test_public_node_access_reads_types_and_values_without_resolving():
    """help (mtrain.cli.help) and the unknown-key check (mtrain.config_checks) read a config's
    sections and values with OmegaConf's public API, never resolving an interpolation that only
    Hydra's runtime could resolve."""
    cfg = OmegaConf.merge(OmegaConf.structured(FitConfig), {"data": {"cache_dir": "${hydra:runtime.cwd}/cache"}})
    assert OmegaConf.get_type(cfg, "model") is ModelConfig
    assert OmegaConf.get_type(cfg, "seed") is int
    assert isinstance(cfg["model"], DictConfig)
    values = OmegaConf.to_container(cfg.data, resolve=False)
    assert values["cache_dir"] == "${hydra:runtime.cwd}/cache"
    assert OmegaConf.to_container(cfg.model, resolve=False)["activation"] is Activation.relu
