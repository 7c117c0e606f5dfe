"""Every preset in configs/experiment/ composes and validates; every ablation sweep names
real config keys with valid values, its job 0 is the standard model, and each variant
builds a (tiny) model that runs forward and backward.

Composition is the slow part (~0.2 s of CPU each), so each preset is composed once and a
sweep's variants are applied to a copy the way Hydra applies a command-line override
(`OmegaConf.update(cfg, key, value, merge=True)` on the typed config, which refuses unknown
keys and wrong types).
"""

from __future__ import annotations

import copy
import itertools
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from omegaconf import DictConfig, OmegaConf

from mtrain.cli.common import CONFIG_DIR
from mtrain.config import ModelConfig, check_model_config
from mtrain.config_checks import check_config
from mtrain.durations import parse_duration
from mtrain.model import build_model
from mtrain.train.schedule import LearningRateSchedule
from tests.fit_runs import composed

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny models

PRESETS = sorted(path.stem for path in (Path(CONFIG_DIR) / "experiment").glob("*.yaml"))
# The sweeps (ablation_base is what they share: the standard model, no sweep).
ABLATIONS = [name for name in PRESETS if name.startswith("ablation_") and name != "ablation_base"]

# Small enough for milliseconds per forward/backward; the swept switches are untouched.
TINY_MODEL = {"encoder_layers": 2, "decoder_layers": 2, "d_model": 32, "heads": 2, "ffn_dim": 64, "dropout": 0.0}
VOCAB, PAD = 40, 1


def sweep_variants(params: dict) -> list[list[Override]]:
    """The jobs of `mtrain fit -m`: the basic sweeper's Cartesian product, in its order."""
    parser = OverridesParser.create()
    per_key = []
    for override in parser.parse_overrides([f"{key}={values}" for key, values in params.items()]):
        key = override.get_key_element()
        if override.is_sweep_override():
            values = list(override.sweep_string_iterator())
        else:
            values = [override.get_value_element_as_str()]
        per_key.append([f"{key}={value}" for value in values])
    return [parser.parse_overrides(list(job)) for job in itertools.product(*per_key)]


def apply(cfg: DictConfig, overrides: list[Override]) -> DictConfig:
    for override in overrides:
        OmegaConf.update(cfg, override.key_or_group, override.value(), merge=True)
    return cfg


def standard_value(key: str):
    """The standard model's `model.<key>` (final_norm null means on, with pre-norm)."""
    return True if key == "final_norm" else getattr(ModelConfig(), key)


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_composes_and_validates(preset):
    cfg, _ = composed(preset)
    if preset == "finetune_nllb":  # init_vocab=corpus trims the vocabulary of the model given on the command line
        assert cfg.init_from is None and cfg.init_vocab == "corpus"
        cfg.init_from = "facebook/nllb-200-distilled-600M"
    check_config(cfg)  # keys, values and the model (what `mtrain fit` checks before it starts)
    LearningRateSchedule(cfg.train)
    if preset.startswith("finetune"):  # the recipe of docs/FINETUNE.md: a whole-run budget, early stopping by val BLEU
        assert parse_duration(cfg.train.max_time) == 30 * 60 and cfg.train.patience and cfg.train.valid_bleu
        assert preset == "finetune_nllb" or cfg.init_from is None  # given on the command line: the model to fine-tune
        return
    # The CPU presets share the 2-core, 20-minute training budget (25 for the whole run); the GPU
    # preset trains 3 minutes (5 for the whole run).
    gpu = preset.endswith("_gpu")
    assert parse_duration(cfg.train.max_train_time, "train.max_train_time") == (3 if gpu else 20) * 60
    assert parse_duration(cfg.train.max_time) == (5 if gpu else 25) * 60
    assert cfg.data.name == "multi30k"


def test_every_claim_has_a_preset():
    assert {
        "ablation_norm_position",
        "ablation_residual",
        "ablation_shared_norm",
        "ablation_cross_projections",
        "ablation_decoder_order",
        "ablation_detach_memory",
        "ablation_norm_type",
        "ablation_activation",
        "ablation_positions",
        "ablation_scale_embeddings",
        "ablation_tie_embeddings",
    } <= set(ABLATIONS)


@pytest.mark.parametrize("preset", ABLATIONS)
def test_ablation_sweep_starts_from_the_standard_and_records_instruments(preset):
    cfg, params = composed(preset)
    assert params, f"{preset}: no hydra.sweeper.params"
    assert cfg.train.instruments and 0 < cfg.train.instrument_every <= 50
    variants = sweep_variants(params)
    assert len(variants) >= 2
    for override in variants[0]:
        assert override.key_or_group.startswith("model."), override.input_line
        name = override.key_or_group.removeprefix("model.")
        assert override.value() == standard_value(name), f"{preset}: job 0 is not the standard model"


@pytest.mark.parametrize("preset", ABLATIONS)
def test_every_sweep_variant_builds_and_trains_one_step(preset):
    base, params = composed(preset)
    src = torch.tensor([[5, 6, 7, 8, 3], [9, 10, 3, PAD, PAD]])
    padding = src == PAD
    tgt_in = torch.tensor([[2, 11, 12, 13], [2, 14, 15, PAD]])
    tgt_out = torch.tensor([[11, 12, 13, 3], [14, 15, 3, PAD]])
    models = set()
    for variant in sweep_variants(params):
        cfg = apply(copy.deepcopy(base), variant)
        check_model_config(cfg.model)
        models.add(OmegaConf.to_yaml(cfg.model))
        model_cfg = OmegaConf.merge(cfg.model, TINY_MODEL)
        torch.manual_seed(0)
        model = build_model(model_cfg, VOCAB, VOCAB, PAD, joint_vocab=True).train()
        logits = model(src, padding, tgt_in)
        loss = F.cross_entropy(logits[..., :VOCAB].reshape(-1, VOCAB), tgt_out.reshape(-1), ignore_index=PAD)
        loss.backward()
        label = " ".join(o.input_line for o in variant)
        assert torch.isfinite(loss), label
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        assert grads and all(torch.isfinite(g).all() for g in grads), label
    assert len(models) == len(sweep_variants(params))  # no two jobs train the same model


def test_a_bad_sweep_value_is_caught():
    """The checks above do fail on a typo in a preset's sweep values."""
    cfg, _ = composed("ablation_norm_position")
    with pytest.raises(Exception, match="norm_position"):
        check_model_config(apply(cfg, sweep_variants({"model.norm_position": "pre,psot"})[1]).model)
    with pytest.raises(Exception, match="detach_memory"):
        apply(cfg, sweep_variants({"model.detach_memory": "maybe"})[0])
    with pytest.raises(Exception, match="detach_memroy"):
        apply(cfg, sweep_variants({"model.detach_memroy": "true"})[0])


def test_norm_position_preset_is_deep_and_starts_without_warmup():
    cfg, _ = composed("ablation_norm_position")
    standard, _ = composed("multi30k_cpu")
    assert cfg.model.encoder_layers >= 6 and cfg.model.decoder_layers >= 6
    assert cfg.model.encoder_layers > standard.model.encoder_layers
    assert cfg.train.warmup_updates == 0 and cfg.train.warmup_time is None and cfg.train.lr >= 1e-3


# ----------------------------------------------------------------------------- scripts/run_ablations.py
def _bench_script():
    import importlib.util
    import sys

    path = Path(CONFIG_DIR).parent / "scripts" / "run_ablations.py"
    spec = importlib.util.spec_from_file_location("run_ablations", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_bench_plan_names_each_model_once_and_every_claim_compares_real_runs():
    bench = _bench_script()
    names = [run.name for run in bench.RUNS]
    assert len(set(names)) == len(names)
    models = {run.overrides for run in bench.RUNS}
    assert len(models) == len(bench.RUNS)  # no model trained twice under two names
    for claim, runs in bench.CLAIMS.items():
        assert len(runs) >= 2 and set(runs) <= set(names), claim
    assert set(names) == {name for runs in bench.CLAIMS.values() for name in runs}  # no orphan run


def test_bench_runs_compose_and_differ_from_their_reference_by_their_switches_only():
    bench = _bench_script()
    by_name = {run.name: run for run in bench.RUNS}
    parser = OverridesParser.create()

    def config_of(name: str) -> DictConfig:
        preset, *switches = by_name[name].overrides
        cfg, _ = composed(preset.removeprefix("experiment="))
        cfg = apply(cfg, parser.parse_overrides(switches))
        check_model_config(cfg.model)
        return cfg

    for claim, names in bench.CLAIMS.items():
        reference = config_of(names[0])
        for name in names[1:]:
            cfg = config_of(name)
            switched = {o.split("=")[0] for o in by_name[name].overrides[1:] + by_name[names[0]].overrides[1:]}
            differing = {f"model.{k}" for k in cfg.model if cfg.model[k] != reference.model[k]}
            differing |= {f"train.{k}" for k in cfg.train if cfg.train[k] != reference.train[k]}
            differing |= {"seed"} if cfg.seed != reference.seed else set()
            assert differing and differing <= switched, (claim, name, differing)
        assert reference.model.norm_position == "pre"


def test_bench_summary_averages_seeds_and_gives_the_gap_to_the_reference(tmp_path):
    import argparse
    import json

    bench = _bench_script()
    scores = {"standard": 30.0, "standard_seed2": 31.0, "rmsnorm": 29.0, "rmsnorm_seed2": 29.5}
    for name, bleu in scores.items():
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "metrics.json").write_text(json.dumps({"test": {"bleu": bleu}}))
    text = bench.summary(["norm_type"], [1, 2], argparse.Namespace(out=str(tmp_path)))
    # Over seeds: sd of 30 and 31 is 0.71; the 95% t quantile of 1 df is 12.706: ± 6.35.
    assert "| run | seed 1 | seed 2 | over seeds | Δ | n | p (Welch) |" in text
    assert "| standard | 30.00 | 31.00 | 30.50 ± 0.71 [24.15, 36.85] | - | - | - |" in text
    rmsnorm = next(line for line in text.splitlines() if line.startswith("| rmsnorm |")).split(" | ")
    assert rmsnorm[1:6] == ["29.00", "29.50", "29.25 ± 0.35 [26.07, 32.43]", "-1.25", "2"]
    assert 0.1 < float(rmsnorm[6].rstrip(" |")) < 0.5  # a 1.25 gap over two noisy seeds: not established
    (tmp_path / "runs" / "rmsnorm_seed2" / "metrics.json").unlink()  # seed 2 not trained: compare seed 1 only
    text = bench.summary(["norm_type"], [1, 2], argparse.Namespace(out=str(tmp_path)))
    assert "| rmsnorm | 29.00 | - | 29.00 (1 seed) | -1.00 | 1 | - |" in text
    assert bench.with_seed(bench.RUNS[0], 3).overrides[-1] == "seed=3"
    assert bench.with_seed(bench.RUNS[0], 1) == bench.RUNS[0]


def _finished_run(bench, run, args, run_dir: Path) -> None:
    """A run folder as `mtrain fit` leaves it: its recorded overrides and its metrics."""
    import json

    import yaml

    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(bench.run_overrides(run, args)))
    (run_dir / "metrics.json").write_text(json.dumps({"test": {"bleu": 20.0}}))


def test_bench_reuses_a_finished_run_only_for_the_same_command(tmp_path, capsys):
    """A folder trained with 200 updates is not taken for a 600-update run (issue 59, item 1):
    the bench names the differing overrides, trains nothing, and exits non-zero."""
    bench = _bench_script()
    standard = bench.RUNS[0]
    short = bench.parse_arguments(["--out", str(tmp_path), "--updates", "200", "--only", "norm_type"])
    _finished_run(bench, standard, short, tmp_path / "runs" / "standard")
    assert bench.reuse_conflict(standard, short) is None
    other_threads = bench.parse_arguments(["--out", str(tmp_path), "--updates", "200", "--threads", "2"])
    assert bench.reuse_conflict(standard, other_threads) is None  # speed, not what is trained
    longer = bench.parse_arguments(["--out", str(tmp_path), "--updates", "600", "--only", "norm_type"])
    conflict = bench.reuse_conflict(standard, longer)
    assert "train.max_updates=200" in conflict and "train.max_updates=600" in conflict
    assert "rmsnorm" not in conflict
    with pytest.raises(SystemExit) as stopped:
        bench.main(["--out", str(tmp_path), "--updates", "600", "--only", "norm_type"])
    assert stopped.value.code == 2
    assert "train.max_updates=200" in capsys.readouterr().err
    assert not (tmp_path / "logs").exists() and not (tmp_path / "runs" / "rmsnorm").exists()  # nothing trained
    (tmp_path / "runs" / "standard" / ".hydra" / "overrides.yaml").unlink()
    assert "no record of its command" in bench.reuse_conflict(standard, short)


def test_bench_only_trains_the_claim_and_its_reference(capsys):
    """`--only residual` trains the standard model and the normalised residual; post_norm, which
    the residual report shows beside them, only with the whole bench or when --runs names it."""
    bench = _bench_script()

    def planned(*argv: str) -> list[str]:
        bench.main(["--dry-run", *argv])
        return [line.rsplit("/", 1)[-1] for line in capsys.readouterr().out.splitlines()]

    assert planned("--only", "residual") == ["standard", "residual_normalized"]
    assert planned("--only", "positions") == ["standard", "positions_learned", "positions_rope", "positions_none"]
    assert planned("--only", "residual", "--runs", "post_norm") == ["post_norm"]
    assert "post_norm" in planned()


TINY_BENCH = [
    "model.encoder_layers=1",
    "model.decoder_layers=1",
    "model.d_model=32",
    "model.heads=2",
    "model.ffn_dim=64",
    "tokenizer.vocab_size=300",
    "train.max_tokens=512",
    "train.precision=fp32",
    "train.log_every=5",
    "decode.beam=1",
    "decode.max_len_b=5",
    "decode.max_len_a=1.2",
]


def _start_bench(tmp_path, slice_dir: Path, *argv: str, overrides: tuple[str, ...] = ()) -> subprocess.Popen:
    script = Path(CONFIG_DIR).parent / "scripts" / "run_ablations.py"
    data = [f"data.local_dir={slice_dir}", f"data.cache_dir={tmp_path / 'cache'}"]
    return subprocess.Popen(
        [
            sys.executable,
            str(script),
            "--out",
            str(tmp_path / "bench"),
            "--lanes",
            "1",
            *argv,
            "--",
            *data,
            *TINY_BENCH,
            *overrides,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.slow
def test_bench_prints_each_runs_start_progress_and_end(tmp_path, multi30k_slice):
    first = _start_bench(
        tmp_path,
        multi30k_slice,
        "--only",
        "shared_norm",
        "--runs",
        "standard",
        "--updates",
        "10",
        "--progress-every",
        "0",
    )
    out, _ = first.communicate(timeout=240)
    assert first.returncode == 0, out
    assert "[1/1] standard seed=1: started (pid " in out
    assert "[1/1] standard seed=1: update 10/10 (" in out
    assert re.search(r"\[1/1\] standard seed=1: done in 0m\d\ds: BLEU \d+\.\d\d", out), out
    again = _start_bench(tmp_path, multi30k_slice, "--only", "shared_norm", "--runs", "standard", "--updates", "10")
    out, _ = again.communicate(timeout=120)
    assert again.returncode == 0 and "[1/1] standard seed=1: done already (same command), BLEU" in out, out


@pytest.mark.slow
def test_a_failed_run_makes_the_bench_fail_with_its_reason(tmp_path, multi30k_slice):
    bench = _start_bench(
        tmp_path,
        multi30k_slice,
        "--only",
        "shared_norm",
        "--runs",
        "standard",
        "--updates",
        "10",
        overrides=("model.heads=3",),
    )
    out, _ = bench.communicate(timeout=120)
    assert bench.returncode == 1, out
    assert "[1/1] standard seed=1: FAILED after 0m" in out
    assert "model.heads: 3 does not divide model.d_model=32" in out.split("FAILED", 1)[1].splitlines()[0]
    assert "| standard | failed |" in out


@pytest.mark.slow
def test_stopping_the_bench_stops_its_trainings(tmp_path, multi30k_slice):
    """SIGTERM to the bench reaches every training (each in its own process group): they write
    a checkpoint and exit, and the bench exits with 128 + 15 without writing reports."""
    bench = _start_bench(
        tmp_path,
        multi30k_slice,
        "--only",
        "shared_norm",
        "--lanes",
        "2",
        "--updates",
        "100000",
        "--progress-every",
        "0",
    )
    pids, lines = set(), []
    for line in bench.stdout:
        lines.append(line)
        pids |= {int(pid) for pid in re.findall(r"started \(pid (\d+)", line)}
        if "update 1/100000" in line and len(pids) == 2:
            break
    assert len(pids) == 2, "".join(lines)
    for pid in pids:
        assert os.getpgid(pid) == pid  # its own group: a terminal's Ctrl-C reaches the bench only
    bench.send_signal(signal.SIGTERM)
    out, _ = bench.communicate(timeout=60)
    assert bench.returncode == 128 + signal.SIGTERM, out
    assert out.count("stopped after") == 2 and "stopped by SIGTERM: no reports written" in out
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    for name in ("standard", "shared_norm"):
        assert "SIGTERM received" in (tmp_path / "bench" / "logs" / f"{name}.log").read_text()
    assert not (tmp_path / "bench" / "summary.md").exists()


@pytest.mark.slow
def test_a_sweep_side_by_side_with_the_joblib_launcher_reports_its_failed_job(tmp_path, multi30k_slice):
    """docs/ABLATIONS.md's parallel sweep: hydra/launcher=joblib runs the jobs in two worker
    processes; a job that fails there still makes the command exit 1 and name it (the basic
    launcher's tally is in the worker, so mtrain reads the sweep directory)."""
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    sweep = tmp_path / "sweep"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mtrain",
            "fit",
            "-m",
            "hydra/launcher=joblib",
            "hydra.launcher.n_jobs=2",
            "train.num_threads=1",
            f"data.local_dir={multi30k_slice},{tmp_path / 'nowhere'}",
            f"data.cache_dir={tmp_path / 'cache'}",
            *TINY_BENCH,
            "train.max_time=null",
            "train.max_train_time=null",
            "train.max_updates=2",
            "train.validate_every=2",
            "data.splits.test=null",
            f"hydra.sweep.dir={sweep}",
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stderr.splitlines()[-1].startswith(
        f"mtrain: error: 1 of 2 sweep jobs failed: job 1 (data.local_dir={tmp_path / 'nowhere'})"
    )
    assert (sweep / "0" / "metrics.json").is_file() and (sweep / "1" / "failed.json").is_file()


def test_best_model_preset_keeps_the_benchmark_size():
    """experiment=multi30k_cpu_best: the benchmark's layers, width and vocabulary, <= 7.6M
    parameters (issue 16), a Pre-LN encoder-decoder; only its switches, learning rate and
    weight decay differ."""
    best, _ = composed("multi30k_cpu_best")
    benchmark, _ = composed("multi30k_cpu")
    for key in ("encoder_layers", "decoder_layers", "d_model", "heads", "norm_position", "tie_embeddings"):
        assert best.model[key] == benchmark.model[key], key
    assert best.tokenizer == benchmark.tokenizer
    # The same budget and batches (20 minutes, 2 threads, 2,048 tokens); only the optimiser's
    # peak learning rate and weight decay are the preset's own.
    differing = {key for key in benchmark.train if best.train[key] != benchmark.train[key]}
    assert differing == {"lr", "weight_decay"}, differing
    vocab = best.tokenizer.vocab_size
    model = build_model(best.model, vocab, vocab, 1, joint_vocab=True)
    assert sum(p.numel() for p in model.parameters()) <= 7_600_000
