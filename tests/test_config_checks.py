"""Every bad config value and every override Hydra cannot apply is refused before any work:
one `mtrain: error: <key>: <why>` line, exit status 2, no traceback, nothing written.

Most cases run the check in-process (`check_before_run`, what each command's `main()` calls
before Hydra starts; milliseconds each); a few run the `mtrain` command itself.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from mtrain.cli.common import CONFIG_DIR, check_before_run
from mtrain.config import (
    Activation,
    DataConfig,
    DecodeConfig,
    FitConfig,
    ModelConfig,
    TokenizerConfig,
    TrainConfig,
    resolved_model,
    to_plain,
    with_resolved_model,
)
from tests.fit_runs import assert_refused, run_check
from tests.warm_process import run_mtrain

# (overrides, the key the one error line must start with)
BAD_FIT_VALUES = [
    (["decode.beam=0"], "decode.beam"),
    (["decode.valid_beam=0"], "decode.valid_beam"),
    (["train.validate_every=0"], "train.validate_every"),
    (["train.log_every=0"], "train.log_every"),
    (["train.max_tokens=0"], "train.max_tokens"),
    (["train.max_tokens=-5"], "train.max_tokens"),
    (["train.lr=-1"], "train.lr"),
    (["train.betas=[0.9]"], "train.betas"),
    (["train.betas=[0.9,1.5]"], "train.betas"),
    (["train.num_threads=-1"], "train.num_threads"),
    (["seed=-1"], "seed"),
    (["decode.sampling=topk", "decode.nbest=0"], "decode.nbest"),
    (["decode.sampling=topk", "decode.top_k=-1"], "decode.top_k"),
    (["decode.sampling=topp", "decode.top_p=0"], "decode.top_p"),
    (["decode.sampling=topp", "decode.temperature=0"], "decode.temperature"),
    (["decode.nbest=6"], "decode.nbest"),
    (["train.update_freq=0"], "train.update_freq"),
    (["train.label_smoothing=2"], "train.label_smoothing"),
    (["train.label_smoothing=-0.1"], "train.label_smoothing"),
    (["decode.max_len_a=-5", "decode.max_len_b=-5"], "decode.max_len_a"),
    (["decode.max_len_b=-5"], "decode.max_len_b"),
    (["decode.max_len_a=0", "decode.max_len_b=0"], "decode.max_len_a/max_len_b"),
    (["train.max_time=2min"], "train.max_time"),
    (["train.max_time=0s"], "train.max_time"),
    (["train.keep_last=0"], "train.keep_last"),
    (["train.patience=0"], "train.patience"),
    (["train.clip_norm=-1"], "train.clip_norm"),
    (["train.eps=0"], "train.eps"),
    (["train.scheduler=cosine"], "train.scheduler"),
    (["train.max_time=10m", "train.warmup_time=100%"], "train.warmup_time"),
    (["train.max_time=10m", "train.warmup_time=11m"], "train.warmup_time"),
    (["train.max_time=10m", "train.warmup_time=soon"], "train.warmup_time"),
    (["train.save_every=often"], "train.save_every"),
    (["train.validate_every_time=0s"], "train.validate_every_time"),
    (["train.shape_buckets=-1"], "train.shape_buckets"),
    (["train.cuda_graphs=true", "train.shape_buckets=0"], "train.cuda_graphs"),
    (["model.dropout=1"], "model.dropout"),
    (["model.attention_dropout=-0.1"], "model.attention_dropout"),
    (["model.heads=5"], "model.heads"),
    (["model.layers=0"], "model.layers"),
    (["model.norm_position=post", "model.residual_input=normalized"], "model.residual_input"),
    (["tokenizer.vocab_size=0"], "tokenizer.vocab_size"),
    (["tokenizer.pad_id=0"], "tokenizer.unk_id/pad_id/bos_id/eos_id"),
    (["tokenizer.character_coverage=0"], "tokenizer.character_coverage"),
    (["data.clean.max_len=0"], "data.clean.max_len"),
    (["data.clean.max_len_ratio=0.5"], "data.clean.max_len_ratio"),
    (["data.train_limit=0"], "data.train_limit"),
    # inf and nan (issue 40): a range check such as `> 0` lets inf through
    (["data.corpora=[{name: multi30k, weight: inf}]"], "data.corpora[0].weight"),
    (["data.corpora=[{name: multi30k}, {name: bt, weight: nan}]"], "data.corpora[1].weight"),
    (["data.corpora=[{name: multi30k, weight: -inf}]"], "data.corpora[0].weight"),
    (["data.sampling_temperature=inf"], "data.sampling_temperature"),
    (["train.betas=[0.9,nan]"], "train.betas[1]"),
    (["train.lr=inf"], "train.lr"),
    (["decode.max_len_a=inf"], "decode.max_len_a"),
    # one source into two languages: nothing would tell the model which to write
    (["tokenizer.joint=true", "data.corpora=[{src: de, tgt: en}, {src: de, tgt: fr}]"], "data.lang_tags"),
]

# (overrides, the start of the one error line, a part of it)
BAD_OVERRIDES = [
    (["train.max_tokes=1"], "train.max_tokes: unknown config key", "(did you mean train.max_tokens?)"),
    (["trian.lr=1"], "trian.lr: unknown config key", "(did you mean train.lr?)"),
    (["+train.max_tokes=1"], "train.max_tokes: unknown config key", "(did you mean train.max_tokens?)"),
    (["train.lr=fast"], "train.lr: 'fast' is not a float", ""),
    (["model.final_norm=maybe"], "model.final_norm:", "maybe"),
    (["model.activation=rleu"], "model.activation: 'rleu' is not one of relu|gelu|silu|swiglu", "(did you mean relu?)"),
    (["decode.sampling=top_p"], "decode.sampling: 'top_p' is not one of none|topk|topp", "(did you mean topp?)"),
    (["train.precision=bf61"], "train.precision:", "(did you mean bf16?)"),
    (["model=transfomer"], "model: no preset named 'transfomer'", "(did you mean model=transformer_"),
    # fairseq habits: a key without its section, `-` for `_`; the nearest size, not the nearest spelling
    (["lr=1e-3"], "lr: unknown config key", "(did you mean train.lr?)"),
    (["max-tokens=4096"], "max-tokens: unknown config key", "(did you mean train.max_tokens or decode.max_tokens?)"),
    (["max_tiem=3m"], "max_tiem: unknown config key", "(did you mean train.max_time?)"),
    (["+beam=5"], "beam: unknown config key", "(did you mean decode.beam?)"),
    (
        ["model=transformer_tiny"],
        "model: no preset named 'transformer_tiny'",
        "(did you mean model=transformer_small?)",
    ),
    (
        ["model=transformer_medium"],
        "model: no preset named",
        "(did you mean model=transformer_base or model=transformer_big?)",
    ),
    (
        ["experiment=multi30k_cp"],
        "experiment: no preset named 'multi30k_cp'",
        "(did you mean experiment=multi30k_cpu?)",
    ),
    (["train.max_tokens=1,2"], "train.max_tokens: '1,2' is several values", "-m"),
    (["train.max_tokens=fast"], "train.max_tokens: 'fast' is not an integer", ""),
    (["data.src=de,fr"], "data.src: 'de,fr' is several values: add -m to sweep over them (data.src takes one)", ""),
    (["foo"], "foo: not an override of the form key=value", ""),
]


@pytest.fixture(autouse=True)
def _no_full_errors(monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)


@pytest.mark.parametrize("overrides, key", BAD_FIT_VALUES, ids=[" ".join(o) for o, _ in BAD_FIT_VALUES])
def test_a_bad_value_is_one_line_before_the_run_directory_exists(overrides, key, tmp_path, capsys):
    status, lines = run_check("fit", [*overrides, f"hydra.run.dir={tmp_path / 'run'}"], capsys)
    assert_refused(status, lines, f"{key}: ")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("overrides, start, part", BAD_OVERRIDES, ids=[" ".join(o) for o, _, _ in BAD_OVERRIDES])
def test_an_override_hydra_cannot_apply_is_one_line_with_a_suggestion(overrides, start, part, tmp_path, capsys):
    status, lines = run_check("fit", [*overrides, f"hydra.run.dir={tmp_path / 'run'}"], capsys)
    assert_refused(status, lines, start, part)
    assert not (tmp_path / "run").exists()


def test_suggestions_prefer_the_last_part_of_a_key_and_the_nearest_size():
    from mtrain.config_names import closest_sizes, did_you_mean, did_you_mean_key

    keys = ["seed", "decode.beam", "decode.valid_beam", "decode.seed", "train.lr", "train.max_time"]
    assert did_you_mean_key("beam", keys) == " (did you mean decode.beam?)"
    assert did_you_mean_key("train.beam", keys) == " (did you mean decode.beam?)"  # not train.lr's spelling
    assert did_you_mean_key("train.seed", keys) == " (did you mean seed or decode.seed?)"
    assert did_you_mean_key("train.max_tiem", keys) == " (did you mean train.max_time?)"
    assert did_you_mean_key("warmup", keys) == ""
    presets = ["transformer_base", "transformer_big", "transformer_iwslt", "transformer_small"]
    assert closest_sizes("transformer_tiny", presets) == ["transformer_small"]
    assert closest_sizes("transformer_huge", presets) == ["transformer_big"]
    assert closest_sizes("transformer_wmt", presets) == [] and closest_sizes("tiny", ["small"]) == ["small"]
    assert did_you_mean("transfomer_base", presets, "model=") == " (did you mean model=transformer_base?)"


def test_several_values_for_a_list_key_suggest_the_list(capsys):
    status, lines = run_check("average", ["checkpoints=a.pt,b.pt"], capsys)
    assert_refused(status, lines, "checkpoints: 'a.pt,b.pt' is several values", "write a list as [a.pt,b.pt]")


def test_good_configs_pass_and_write_nothing(tmp_path, capsys):
    assert run_check("fit", ["experiment=multi30k_cpu", f"hydra.run.dir={tmp_path / 'run'}"], capsys) == (0, [])
    assert run_check(
        "fit", ["-m", "experiment=ablation_activation", f"hydra.sweep.dir={tmp_path / 'sweep'}"], capsys
    ) == (0, [])
    assert run_check("translate", ["run=somewhere", "decode=sample", "decode.nbest=4"], capsys) == (0, [])
    assert run_check("eval", ["hyp=h.txt", "ref=[r.txt]"], capsys) == (0, [])
    assert list(tmp_path.iterdir()) == []


def test_every_job_of_a_sweep_is_checked_before_the_first_runs(tmp_path, capsys):
    status, lines = run_check("fit", ["-m", "train.lr=1e-3,-1", f"hydra.sweep.dir={tmp_path / 'sweep'}"], capsys)
    assert_refused(status, lines, "train.lr: -1.0 must be > 0", "(sweep job train.lr=-1 ")
    status, lines = run_check("fit", ["-m", "model.activation=relu,gleu"], capsys)
    assert_refused(
        status, lines, "model.activation: 'gleu' is not one of relu|gelu|silu|swiglu", "(did you mean gelu?)"
    )
    assert not (tmp_path / "sweep").exists()


def test_a_run_directory_that_cannot_be_made(tmp_path, capsys):
    (tmp_path / "file").write_text("not a directory")
    status, lines = run_check("fit", [f"hydra.run.dir={tmp_path / 'file'}"], capsys)
    assert_refused(status, lines, f"hydra.run.dir: {tmp_path / 'file'} is a file")
    status, lines = run_check("fit", [f"hydra.run.dir={tmp_path / 'file' / 'run'}"], capsys)
    assert_refused(status, lines, "hydra.run.dir:", "is a file")
    if os.geteuid() != 0:  # root may write anywhere
        (tmp_path / "locked").mkdir(mode=0o500)
        status, lines = run_check("fit", [f"hydra.run.dir={tmp_path / 'locked' / 'run'}"], capsys)
        assert_refused(status, lines, "hydra.run.dir:", "is not writable")


def test_translate_values(tmp_path, capsys):
    for argv, start in (
        ([f"output={tmp_path / 'missing' / 'out.txt'}"], "output:"),
        ([f"output={tmp_path}"], "output:"),
        (["decode.beam=0"], "decode.beam:"),
        (["precision=int8"], "precision: 'int8' is not one of auto|fp32|bf16|fp16 with engine=torch"),
        (["attention_layer=first"], "attention_layer:"),
        (["engine=onnx"], "engine: 'onnx' is not one of torch|ctranslate2"),
    ):
        status, lines = run_check("translate", ["run=somewhere", *argv], capsys)
        assert_refused(status, lines, start)
    assert run_check("translate", ["run=x", "engine=ctranslate2", "precision=int8"], capsys) == (0, [])


def test_eval_out_is_for_run_and_must_be_a_writable_directory(tmp_path, capsys):
    (tmp_path / "file").write_text("not a directory")
    status, lines = run_check("eval", ["run=somewhere", f"out={tmp_path / 'file'}"], capsys)
    assert_refused(status, lines, f"out: {tmp_path / 'file'} is a file")
    for mode in (["hyp=h.txt", "ref=[r.txt]"], ["runs=multirun/x"]):
        status, lines = run_check("eval", [*mode, f"out={tmp_path / 'reports'}"], capsys)
        assert_refused(status, lines, "out: is where `mtrain eval run=RUN` writes its report")
    assert run_check("eval", ["run=somewhere", f"out={tmp_path / 'reports'}"], capsys) == (0, [])
    # hyp= writes the per-sentence TSV there.
    assert run_check(
        "eval", ["hyp=h.txt", "ref=[r.txt]", "per_sentence=true", f"out={tmp_path / 'reports'}"], capsys
    ) == (0, [])
    assert not (tmp_path / "reports").exists()  # checked, not made


def test_eval_per_sentence_is_for_one_run_or_file(capsys):
    status, lines = run_check("eval", ["runs=multirun/x", "per_sentence=true"], capsys)
    assert_refused(status, lines, "per_sentence: scores the lines of one run (run=) or file (hyp=)")
    status, lines = run_check("eval", ["run=somewhere", "per_sentence=true", "worst_lines=-1"], capsys)
    assert_refused(status, lines, "worst_lines: -1 must be >= 0")
    assert run_check("eval", ["run=somewhere", "per_sentence=true", "worst_lines=0"], capsys) == (0, [])


def test_help_and_cfg_stay_hydras_and_cfg_still_refuses_a_typo(capsys):
    assert run_check("fit", ["--help"], capsys) == (0, [])
    assert run_check("fit", ["--cfg", "job", "train.max_time=2m"], capsys) == (0, [])  # prints, runs nothing
    status, lines = run_check("fit", ["--cfg", "job", "train.max_tokes=1"], capsys)
    assert_refused(status, lines, "train.max_tokes: unknown config key")


def test_cfg_job_says_when_the_command_would_refuse_the_config_it_prints(capsys):
    """`--cfg job` of a config `mtrain fit` refuses prints it, then the refusal, and exits 2."""
    with pytest.raises(SystemExit) as stopped:
        check_before_run("fit", ["--cfg", "job", "model.heads=3"])
    printed = capsys.readouterr()
    assert stopped.value.code == 2
    assert "heads: 3" in printed.out and "d_model: 256" in printed.out and "hydra:" not in printed.out
    assert printed.err.splitlines() == [
        "mtrain: error: model.heads: 3 does not divide model.d_model=256 "
        "(--cfg: the config above composes, but the command refuses it)"
    ]
    with pytest.raises(SystemExit):
        check_before_run("fit", ["--cfg", "hydra", "model.heads=3"])
    assert capsys.readouterr().out.startswith("hydra:\n")
    assert run_check("fit", ["--cfg", "job", "model.heads=8"], capsys) == (0, [])  # Hydra prints it
    status, lines = run_check("fit", ["-m", "--cfg", "job", "model.heads=4,8"], capsys)
    assert_refused(status, lines, "--cfg job prints one config, not a sweep's: drop -m")


def test_hydra_full_error_shows_hydras_own_error(monkeypatch, capsys):
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(ConfigCompositionException, match="train.max_tokes"):
        check_before_run("fit", ["train.max_tokes=1"])


def _mtrain(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    return run_mtrain(*args, text=True, cwd=cwd, env=env, timeout=120)


@pytest.mark.parametrize(
    "argv, start",
    [
        (["fit", "decode.beam=0"], "decode.beam: 0 must be >= 1"),
        (
            ["fit", "train.max_tokes=1"],
            "train.max_tokes: unknown config key; check its spelling (did you mean train.max_tokens?)",
        ),
        (["fit", "model=transfomer"], "model: no preset named 'transfomer'"),
        (
            ["fit", "model=transformer_tiny"],
            "model: no preset named 'transformer_tiny' (the presets: transformer_base, transformer_big, "
            "transformer_iwslt, transformer_small) (did you mean model=transformer_small?)",
        ),
        (["translate", "beam=5"], "beam: unknown config key; check its spelling (did you mean decode.beam?)"),
        (["translate", "run=x", "decode.valid_beam=0", "decode.beam=0"], "decode.beam"),
        (["fit", "data.corpora=[{name: multi30k}, {name: bt, weight: inf}]"], "data.corpora[1].weight: inf"),
        (
            ["fit", "tokenizer.joint=true", "data.corpora=[{src: de, tgt: en}, {src: de, tgt: fr}]"],
            "data.lang_tags: false, but data.corpora translates de into en and fr: without a target-language tag",
        ),
    ],
)
def test_the_command_prints_one_line_and_exits_2(argv, start, tmp_path):
    result = _mtrain(*argv, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith(f"mtrain: error: {start}") and result.stderr.count("\n") == 1, result.stderr
    assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------- config.py
def test_choices_read_as_their_strings():
    cfg = OmegaConf.structured(FitConfig)
    assert cfg.model.activation == "relu" and isinstance(cfg.model.activation, Activation)
    assert f"{cfg.model.activation}" == str(cfg.model.activation) == "relu"
    assert {"relu": 1}[cfg.model.activation] == 1 and cfg.model.decoder_order.split("_") == ["self", "cross", "ffn"]
    assert json.loads(json.dumps({"a": cfg.model.activation})) == {"a": "relu"}
    plain = to_plain(cfg)
    assert type(plain["model"]["activation"]) is str and type(plain["train"]["precision"]) is str
    assert OmegaConf.to_yaml(cfg).count("activation: relu") == 1


def test_resolved_model_makes_the_derived_values_explicit_without_changing_its_input():
    composed = OmegaConf.structured(FitConfig(model=ModelConfig(layers=4)))
    resolved = resolved_model(composed.model)
    assert (resolved.encoder_layers, resolved.decoder_layers, resolved.final_norm) == (4, 4, True)
    assert resolved_model(ModelConfig(norm_position="post")).final_norm is False
    assert resolved_model(ModelConfig(final_norm=False)).final_norm is False
    assert resolved_model(resolved) == resolved
    recorded = with_resolved_model(composed)
    assert (recorded.model.encoder_layers, recorded.model.final_norm) == (4, True)
    assert (composed.model.encoder_layers, composed.model.final_norm) == (3, None)  # the user's config as composed


SECTIONS = {
    "data": DataConfig,
    "tokenizer": TokenizerConfig,
    "model": ModelConfig,
    "train": TrainConfig,
    "decode": DecodeConfig,
}


def _restated_defaults(values: dict, schema: type, prefix: str, inherited: dict | None = None) -> list[str]:
    """Keys of `values` that say what they would get anyway: the value an experiment preset
    inherits (from its parent presets and the group presets it picks), else the schema's."""
    defaults = schema()
    inherited = inherited or {}
    restated = []
    for key, value in values.items():
        default = getattr(defaults, key, None)
        if dataclasses.is_dataclass(default):
            restated += _restated_defaults(value or {}, type(default), f"{prefix}{key}.", inherited.get(key) or {})
        elif key in inherited:
            if inherited[key] == value:
                restated.append(f"{prefix}{key}")
        elif hasattr(defaults, key) and default == value:
            restated.append(f"{prefix}{key}")
    return restated


def _inherited(experiment: str) -> dict:
    """What an experiment preset's defaults list gives it: parent presets and group presets."""
    values = yaml.safe_load((Path(CONFIG_DIR) / "experiment" / f"{experiment}.yaml").read_text(encoding="utf-8"))
    merged: dict = {}
    for entry in values.get("defaults", []):
        if isinstance(entry, str) and entry != "_self_":
            parent = _inherited(entry)
            parent_values = yaml.safe_load((Path(CONFIG_DIR) / "experiment" / f"{entry}.yaml").read_text())
            for group in SECTIONS:
                merged[group] = {**merged.get(group, {}), **parent.get(group, {}), **(parent_values.get(group) or {})}
        elif isinstance(entry, dict):
            for key, name in entry.items():
                group = key.replace("override /", "")
                if group in SECTIONS:
                    preset = yaml.safe_load((Path(CONFIG_DIR) / group / f"{name}.yaml").read_text()) or {}
                    merged[group] = {**merged.get(group, {}), **preset}
    return merged


def test_yaml_files_state_only_what_differs_from_the_schema():
    restated = []
    for group, schema in SECTIONS.items():
        for path in sorted((Path(CONFIG_DIR) / group).glob("*.yaml")):
            values = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
            restated += [f"{path.name}: {key}" for key in _restated_defaults(values, schema, f"{group}.")]
    for path in sorted((Path(CONFIG_DIR) / "experiment").glob("*.yaml")):
        values = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        inherited = _inherited(path.stem)
        for group, schema in SECTIONS.items():
            restated += [
                f"{path.name}: {key}"
                for key in _restated_defaults(values.get(group) or {}, schema, f"{group}.", inherited.get(group))
            ]
    assert not restated, restated


def test_every_command_s_defaults_hold_their_ranges_and_rules():
    """A range written beside a field (mtrain.config_fields.ranged) holds for its own default."""
    from mtrain.config import APP_SCHEMAS
    from mtrain.config_fields import check_section

    for schema in set(APP_SCHEMAS.values()):
        check_section(schema())


@pytest.mark.parametrize(
    "limits, text",
    [
        (dict(at_least=1), ">= 1"),
        (dict(above=0), "> 0"),
        (dict(at_least=0, below=1), "in [0, 1)"),
        (dict(above=0, at_most=1), "in (0, 1]"),
        (dict(at_least=0, at_most=65535), "in 0..65535"),
        (dict(at_most=2.5), "<= 2.5"),
    ],
)
def test_a_range_says_its_bounds(limits, text):
    from mtrain.config_fields import Range

    assert Range(**limits).bounds() == text


@pytest.mark.parametrize(
    "overrides, start",
    [
        # a decode range holds whatever the sampling (MBR samples with decode.temperature too)
        (["decode.mbr.candidates=sample", "decode.temperature=0"], "decode.temperature: 0.0 must be > 0"),
        (["decode.top_p=1.5"], "decode.top_p: 1.5 must be in (0, 1]"),
        # issue 49: MBR's cost grows with the square of its candidates
        (["decode.mbr.candidates=sample", "decode.mbr.num_candidates=10000"], "decode.mbr.num_candidates: 10000"),
        (["decode.mbr.num_pseudo_refs=2000"], "decode.mbr.num_pseudo_refs: 2000 must be in 1..1024 (or null)"),
        (["ensemble=[a]", "engine=ctranslate2"], "ensemble: engine=ctranslate2 decodes one model"),
    ],
)
def test_serve_and_translate_refuse_a_decode_value_alike(overrides, start, capsys):
    for command in ("translate", "serve"):
        status, lines = run_check(command, ["run=somewhere", *overrides], capsys)
        assert_refused(status, lines, start)


# ----------------------------------------------------------------------------- one rule, every caller (issue 60)
def _fit_verdict(run: Path) -> str | None:
    """What `mtrain fit` says of `run` as it claims it (rank 0) and as every rank checks it
    (mtrain.cli.fit); None: it would train there."""
    from mtrain.cli.fit import _check_run_dir, _claim
    from mtrain.errors import MtrainError
    from mtrain.rundir import RunDir

    said: list[str | None] = []
    for rank_zero in (True, False):
        try:
            if rank_zero:
                with _claim(RunDir(run)):
                    pass
            else:
                _check_run_dir(RunDir(run), FitConfig())
            said.append(None)
        except MtrainError as error:
            said.append(str(error))
    assert said[0] == said[1], said  # rank 0 and the other ranks alike
    return said[0]


@pytest.mark.parametrize(
    "where, refusal",
    [
        ("new/run", None),
        ("existing", None),
        ("file", "{path} is a file; choose another with hydra.run.dir=PATH"),
        ("file/run", "{path} cannot be made: {tmp}/file is a file; choose another with hydra.run.dir=PATH"),
        ("locked/run", "{path} is not writable ({tmp}/locked denies writing); choose another with hydra.run.dir=PATH"),
    ],
)
def test_a_run_directory_is_judged_by_one_rule_before_the_command_and_as_fit_claims_it(
    tmp_path, capsys, where, refusal
):
    """The command's check (hydra.run.dir, before Hydra makes it) and `mtrain fit` as it starts
    (library callers and torchrun's ranks come in there) say the same, in the same words."""
    if where.startswith("locked") and os.geteuid() == 0:
        pytest.skip("root may write anywhere")
    (tmp_path / "existing").mkdir()
    (tmp_path / "file").write_text("not a directory")
    (tmp_path / "locked").mkdir(mode=0o500)
    path = tmp_path / where
    expected = None if refusal is None else "hydra.run.dir: " + refusal.format(path=path, tmp=tmp_path)
    status, lines = run_check("fit", ["experiment=multi30k_cpu", f"hydra.run.dir={path}"], capsys)
    assert (status, lines) == ((0, []) if expected is None else (2, [f"mtrain: error: {expected}"]))
    assert _fit_verdict(path) == expected


@pytest.mark.parametrize(
    "init_from, hub_id",
    [
        ("Helsinki-NLP/opus-mt-de-en", True),
        ("facebook/nllb-200-distilled-600M", True),
        ("runs/m30k", True),  # (no such directory here: then it can only be a model on the Hub)
        ("./m30k", False),
        (".cache/model", False),
        ("~/model", False),
        ("/no/such/model", False),
        ("runs/m30k/best.pt", False),
        ("my runs/m30k", False),
        ("-x/model", False),
    ],
)
def test_a_hub_id_is_one_rule_for_the_config_check_and_the_download(tmp_path, monkeypatch, init_from, hub_id):
    """init_from= that is no path: the config check lets it pass exactly when the fine-tune then
    asks the Hub for it (mtrain.train.hf_parent), offline here, so from an empty cache."""
    pytest.importorskip("huggingface_hub")
    from mtrain.config import is_hub_id
    from mtrain.config_checks import check_config
    from mtrain.errors import MtrainError
    from mtrain.train.hf_parent import resolve_hub_id

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    assert is_hub_id(init_from) is hub_id
    said: list[str | None] = []  # the config check's refusal, the download's
    for ask in (lambda: check_config(FitConfig(init_from=init_from)), lambda: resolve_hub_id(init_from)):
        try:
            ask()
            said.append(None)
        except MtrainError as error:
            said.append(str(error))
    check, download = said
    if hub_id:  # passes the check, then is asked of the Hub (here: not in the empty cache)
        assert check is None and "not found in the local Hugging Face cache (HF_HUB_OFFLINE is set)" in str(download)
    else:  # refused as a path that does not exist, never asked of the Hub
        assert (check, download) == (
            f"init_from: {init_from!r}: no such run directory, checkpoint file or model directory",
            None,
        )
