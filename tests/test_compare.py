"""mtrain.evaluate.runs/compare: run discovery, the runs table, and sacreBLEU's paired bootstrap."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mtrain.errors import MtrainError
from mtrain.evaluate.compare import compare_runs, comparison_notes, paired_bootstrap
from mtrain.evaluate.metrics import read_lines
from mtrain.evaluate.runs import describe, differing_overrides, discover_runs
from tests.word_lists import ENGLISH_WORDS

SACREBLEU = str(Path(sys.executable).parent / "sacrebleu")
SAMPLES = 300

WORDS = [word for word in ENGLISH_WORDS if word not in ("old", "young", "through", "group")]


def make_sweep(root: Path, runs: dict) -> Path:
    """A fake Hydra multirun dir: {name: (overrides, noise rate of its test hypotheses)}."""
    rng = random.Random(3)
    refs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))).capitalize() + "." for _ in range(120)]
    (root / "test.en").write_text("\n".join(refs) + "\n", encoding="utf-8")
    sweep = root / "sweep"
    for index, (name, (overrides, noise)) in enumerate(runs.items()):
        run = sweep / name
        (run / ".hydra").mkdir(parents=True)
        (run / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides), encoding="utf-8")
        (run / "metrics.json").write_text(
            json.dumps(
                {
                    "valid": {"best_bleu": 20.0 + index, "best_update": 100},
                    "test": {"bleu": 25.0 + index, "chrf": 50.0 + index},
                    "updates": 100 * (index + 1),
                    "train_time_s": 90.0,
                    "diverged": False,
                    "final_train_loss": 3.5 - index / 10,
                }
            ),
            encoding="utf-8",
        )
        if noise is not None:
            (run / "eval").mkdir()
            hyps = [" ".join(w if rng.random() > noise else rng.choice(WORDS) for w in ref.split()) for ref in refs]
            (run / "eval" / "test.hyp").write_text("\n".join(hyps) + "\n", encoding="utf-8")
    (sweep / "multirun.yaml").write_text("hydra: {}\n", encoding="utf-8")
    return sweep


@pytest.fixture
def sweep(tmp_path) -> Path:
    return make_sweep(
        tmp_path,
        {
            "0": (["model.norm_position=pre", "train.max_updates=100"], 0.2),
            "1": (["model.norm_position=post", "train.max_updates=100"], 0.3),
            "2": (["model.norm_position=post", "+model.layers=6", "train.max_updates=100"], None),
        },
    )


def sacrebleu_paired(ref: Path, baseline: Path, system: Path, metrics=("bleu", "chrf")) -> dict:
    """{metric: [(score, mean, ci, p), per system]} parsed from `sacrebleu --paired-bs` (text)."""
    command = [
        SACREBLEU,
        str(ref),
        "-i",
        str(baseline),
        str(system),
        "-m",
        *metrics,
        "--paired-bs",
        "--paired-bs-n",
        str(SAMPLES),
        "-w",
        "4",
        "--no-color",
        "-f",
        "text",
    ]
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    cells = re.findall(r"(\d+\.\d+) \((\d+\.\d+) ± (\d+\.\d+)\)", output)
    p_values = [float(p) for p in re.findall(r"\(p = (\d+\.\d+)\)", output)]
    signatures = dict(re.findall(r"^ - (\S+)\s+(nrefs:\S+)$", output, flags=re.M))
    # Row-major table: baseline row (one cell per metric), then the system row.
    per_metric = {m: [] for m in metrics}
    for index, (score, mean, ci) in enumerate(cells):
        metric = metrics[index % len(metrics)]
        per_metric[metric].append((float(score), float(mean), float(ci)))
    return {"cells": per_metric, "p": dict(zip(metrics, p_values, strict=True)), "signatures": signatures}


def test_discovery_orders_runs_numerically_and_finds_what_differs(tmp_path):
    sweep = make_sweep(tmp_path, {str(i): ([f"train.lr={i}e-4", "seed=1"], None) for i in (0, 1, 2, 10)})
    runs = discover_runs(str(sweep))
    assert [run.name for run in runs] == ["0", "1", "2", "10"]
    assert differing_overrides(runs) == ["train.lr"]
    assert describe(runs[3], ["train.lr"]) == "train.lr=10e-4"
    assert runs[1].score("valid") == 21.0 and runs[1].score("test", "chrf") == 51.0


def test_discovery_of_a_run_list_and_bad_specs(sweep):
    runs = discover_runs(f"{sweep / '1'},{sweep / '0'}")
    assert [run.name for run in runs] == ["1", "0"]
    assert differing_overrides(runs) == ["model.norm_position"]
    with pytest.raises(MtrainError, match="no such run directory"):
        discover_runs(f"{sweep / '0'},{sweep / 'nope'}")
    with pytest.raises(MtrainError, match="no runs found"):
        discover_runs(str(sweep / "0" / ".hydra"))
    (sweep / "0" / "metrics.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(MtrainError, match=r"metrics\.json: not valid JSON"):
        discover_runs(str(sweep))


def test_paired_bootstrap_equals_sacrebleu_command_line(sweep, tmp_path):
    ref = tmp_path / "test.en"
    baseline, system = sweep / "0" / "eval" / "test.hyp", sweep / "1" / "eval" / "test.hyp"
    expected = sacrebleu_paired(ref, baseline, system)
    assert all(len(cells) == 2 for cells in expected["cells"].values()) and len(expected["p"]) == 2

    results, signatures = paired_bootstrap(
        [("0", read_lines(baseline)), ("1", read_lines(system))],
        [read_lines(ref)],
        metrics=["bleu", "chrf"],
        num_samples=SAMPLES,
    )
    for metric, display in (("bleu", "BLEU"), ("chrf", "chrF2")):
        for (name, result), cli_cells in zip(results.items(), expected["cells"][metric], strict=True):
            ours = (round(result[metric].score, 4), round(result[metric].mean, 4), round(result[metric].ci, 4))
            assert ours == cli_cells, (metric, name)
        assert results["0"][metric].p_value is None
        assert round(results["1"][metric].p_value, 4) == expected["p"][metric]
        assert signatures[metric] == expected["signatures"][display]
    assert f"bs:{SAMPLES}" in signatures["bleu"] and "seed:12345" in signatures["bleu"]


def test_comparison_table_with_baseline_choice(sweep, tmp_path):
    refs = [read_lines(tmp_path / "test.en")]
    runs = discover_runs(str(sweep))
    comparison = compare_runs(runs, refs, baseline="1", metrics=["bleu"], num_samples=SAMPLES)
    assert [run.name for run in comparison.runs] == ["1", "0", "2"]
    assert comparison.keys == ["model.norm_position", "model.layers"]
    assert set(comparison.paired) == {"1", "0"} and "2" in comparison.skipped
    table = comparison.table()
    assert table.headers[:9] == [
        "run",
        "differs",
        "val BLEU",
        "test BLEU",
        "test chrF",
        "final loss",
        "diverged",
        "updates",
        "train time",
    ]
    assert table.headers[9:] == ["BLEU μ ± 95% CI", "p (BLEU)"]
    first, second, third = table.rows
    assert first[0] == "1 (baseline)" and first[1] == "model.norm_position=post" and first[10] == "-"
    assert second[1] == "model.norm_position=pre" and 0 < float(second[10]) <= 1
    assert third[1] == "model.norm_position=post model.layers=6" and third[9:] == ["-", "-"]
    assert first[2:9] == ["21.00", "26.00", "51.00", "3.400", "no", "200", "1.5m"]

    with pytest.raises(MtrainError, match=r"baseline=7: not one of the runs \(0, 1, 2\)"):
        compare_runs(runs, refs, baseline="7")
    with pytest.raises(MtrainError, match="baseline 2: has no test hypotheses"):
        compare_runs(runs, refs, baseline="2")


def test_hypotheses_of_the_wrong_length_name_the_file(sweep, tmp_path):
    refs = [read_lines(tmp_path / "test.en")]
    (sweep / "1" / "eval" / "test.hyp").write_text("one line\n", encoding="utf-8")
    with pytest.raises(MtrainError, match=r"1/eval/test\.hyp has 1 lines but reference 1 has 120"):
        compare_runs(discover_runs(str(sweep)), refs, num_samples=10)


def test_eval_app_compares_runs(sweep, tmp_path, monkeypatch, capsys):
    from mtrain.cli import main as cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "mtrain",
            "eval",
            f"runs={sweep / '0'},{sweep / '1'}",
            f"ref={tmp_path / 'test.en'}",
            f"bootstrap_samples={SAMPLES}",
            "metrics=[bleu]",
        ],
    )
    cli.main()
    printed = capsys.readouterr().out
    expected = sacrebleu_paired(
        tmp_path / "test.en", sweep / "0" / "eval" / "test.hyp", sweep / "1" / "eval" / "test.hyp", metrics=("bleu",)
    )
    assert len(expected["cells"]["bleu"]) == 2
    (_, mean, ci) = expected["cells"]["bleu"][1]
    assert f"{mean:.2f} ± {ci:.2f}" in printed
    assert f"{expected['p']['bleu']:.4f}" in printed
    assert "0 (baseline)" in printed and "model.norm_position=post" in printed


def test_run_lists_and_references_as_users_type_them():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from mtrain.cli.overrides import friendly_overrides

    parser = OverridesParser.create()
    argv = ["runs=out/a,out/b", "ref=test.en", "ref=r1.en,r2.en", "ref=[x.en]", "baseline=0", "-m"]
    rewritten = friendly_overrides(argv)
    assert rewritten[-2:] == ["baseline=0", "-m"]
    values = [parser.parse_override(arg).value() for arg in rewritten[:4]]
    assert values == ["out/a,out/b", ["test.en"], ["r1.en", "r2.en"], ["x.en"]]
    odd = "dir with 'quote', comma\\"
    assert parser.parse_override(friendly_overrides([f"runs={odd},x"])[0]).value() == f"{odd},x"


def write_run_config(run: Path, corpus: Path, test_split: str = "test") -> None:
    from omegaconf import OmegaConf

    from mtrain.config import FitConfig

    cfg = OmegaConf.structured(FitConfig)
    cfg.data.local_dir = str(corpus)
    cfg.data.splits.merge_with({"train": "test", "valid": "test", "test": test_split})
    (run / "config.yaml").write_text(OmegaConf.to_yaml(cfg), encoding="utf-8")


def test_references_come_from_the_runs_data_config(sweep, tmp_path):
    refs = read_lines(tmp_path / "test.en")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for lang in ("de", "en"):
        (corpus / f"test.{lang}").write_text("\n".join(refs) + "\n", encoding="utf-8")
    for name in ("0", "1", "2"):
        write_run_config(sweep / name, corpus)

    runs = discover_runs(str(sweep))
    implicit = compare_runs(runs, None, metrics=["bleu"], num_samples=50)
    explicit = compare_runs(runs, [refs], metrics=["bleu"], num_samples=50)
    assert implicit.paired == explicit.paired and implicit.paired

    write_run_config(sweep / "1", corpus, test_split="other_test")
    different = compare_runs(discover_runs(str(sweep)), None, metrics=["bleu"], num_samples=50)
    assert not different.paired
    assert "name different test sets" in different.bootstrap_note and "ref=FILE" in different.bootstrap_note


def test_references_come_from_the_runs_own_copy_when_the_corpus_is_gone(tmp_path):
    """A relative MTRAIN_DATA_DIR (or the Hub) need not resolve at report time: fit kept the split."""
    from omegaconf import OmegaConf

    from mtrain.config import FitConfig
    from mtrain.evaluate.compare import split_references
    from mtrain.run_summary import load_run_summary

    run_dir = tmp_path / "run"
    cfg = OmegaConf.structured(FitConfig)
    cfg.data.local_dir = str(tmp_path / "moved_away")
    (run_dir / "data").mkdir(parents=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg), encoding="utf-8")
    (run_dir / "data" / "test.src").write_text("ein Hund\nzwei\n", encoding="utf-8")
    (run_dir / "data" / "test.ref").write_text("a dog\ntwo\n", encoding="utf-8")
    references, why = split_references([load_run_summary(run_dir)], "test")
    assert why is None and references == [["a dog", "two"]]


def test_byte_identical_outputs_are_called_identical_not_given_a_p_value(sweep, tmp_path, monkeypatch, capsys):
    """sacreBLEU gives two identical systems p = 0.0010 (its smallest p, as for a real
    difference); the comparison says that they are the same instead."""
    from mtrain.cli import main as cli

    (sweep / "1" / "eval" / "test.hyp").write_bytes((sweep / "0" / "eval" / "test.hyp").read_bytes())
    refs = [read_lines(tmp_path / "test.en")]
    comparison = compare_runs(discover_runs(str(sweep)), refs, metrics=["bleu", "chrf"], num_samples=50)
    for metric in ("bleu", "chrf"):
        result = comparison.paired["1"][metric]
        assert result.identical_to_baseline and result.p_value is None
        assert result.score == comparison.paired["0"][metric].score
        assert not comparison.paired["0"][metric].identical_to_baseline
    table = comparison.table()
    assert table.rows[1][0] == "1" and table.rows[1][10] == table.rows[1][12] == "identical to the baseline"
    assert "identical to the baseline" in table.to_markdown()
    assert any(
        "run 1: its test hypotheses are identical to the baseline 0's" in note for note in comparison_notes(comparison)
    )

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "mtrain",
            "eval",
            f"runs={sweep / '0'},{sweep / '1'}",
            f"ref={tmp_path / 'test.en'}",
            "bootstrap_samples=50",
            "metrics=[bleu]",
        ],
    )
    cli.main()
    printed = capsys.readouterr().out
    assert "identical to the baseline" in printed and "0.0010" not in printed


def test_one_direction_of_multilingual_and_bilingual_runs_is_compared(tmp_path, monkeypatch, capsys):
    """`mtrain eval runs=... src_lang=de tgt_lang=en`: a multilingual run's eval/test.de-en.*
    against a bilingual de-en run's eval/test.*; a run of other directions is left out, saying so."""
    from omegaconf import OmegaConf

    from mtrain.cli import main as cli
    from mtrain.config import CorpusConfig, FitConfig

    rng = random.Random(5)
    refs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))) for _ in range(80)]
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for lang in ("de", "en", "fr"):
        (corpus / f"test.{lang}").write_text("\n".join(refs) + "\n", encoding="utf-8")

    def run(name, report, noise, **data):
        directory = tmp_path / name
        (directory / "eval").mkdir(parents=True)
        cfg = OmegaConf.structured(FitConfig)
        cfg.data.local_dir = str(corpus)
        cfg.data.splits.merge_with({"train": "test", "valid": "test", "test": "test"})
        cfg.data.merge_with(data)
        (directory / "config.yaml").write_text(OmegaConf.to_yaml(cfg), encoding="utf-8")
        hyps = [" ".join(w if rng.random() > noise else rng.choice(WORDS) for w in ref.split()) for ref in refs]
        (directory / "eval" / f"{report}.hyp").write_text("\n".join(hyps) + "\n", encoding="utf-8")
        (directory / "eval" / f"{report}.json").write_text(
            json.dumps({"metrics": {"bleu": {"score": 30.0 + noise}}}), encoding="utf-8"
        )
        return directory

    bilingual = run("bilingual", "test", 0.3)
    multi = run(
        "multi",
        "test.de-en",
        0.2,
        lang_tags=True,
        corpora=[CorpusConfig(src="de", tgt="en"), CorpusConfig(src="en", tgt="de")],
    )
    (multi / "eval" / "test.en-de.hyp").write_text("\n".join(refs) + "\n", encoding="utf-8")  # another direction
    en_fr = run("en_fr", "test", 0.1, src="en", tgt="fr")
    runs = discover_runs(f"{bilingual},{multi},{en_fr}")

    comparison = compare_runs(runs, None, metrics=["bleu"], num_samples=50, direction=("de", "en"))
    assert comparison.reports == {"bilingual": "test", "multi": "test.de-en"}
    assert set(comparison.paired) == {"bilingual", "multi"} and comparison.paired["multi"]["bleu"].p_value is not None
    assert comparison.skipped == {"en_fr": "it does not translate de-en"}
    table = comparison.table()
    assert table.headers[3] == "test de-en BLEU" and [row[3] for row in table.rows][:2] == ["30.30", "30.20"]
    # Without a direction the multilingual run has no test hypotheses of its own: left out.
    assert "multi" in compare_runs(runs, None, metrics=["bleu"], num_samples=50).skipped

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "mtrain",
            "eval",
            f"runs={bilingual},{multi}",
            "src_lang=de",
            "tgt_lang=en",
            "bootstrap_samples=50",
            "metrics=[bleu]",
        ],
    )
    cli.main()
    printed = capsys.readouterr().out
    assert "test de-en BLEU" in printed and "Paired bootstrap" in printed
    monkeypatch.setattr(sys, "argv", ["mtrain", "eval", f"runs={bilingual},{multi}", "src_lang=de"])
    with pytest.raises(SystemExit) as exit_status:
        cli.main()
    assert exit_status.value.code == 2
    assert "runs= with src_lang or tgt_lang compares one direction: give both" in capsys.readouterr().err


# ----------------------------------------------------------------------------- arms over seeds


def test_t_distribution_and_welch_match_closed_forms_and_tables():
    """Student's t without scipy: the 97.5% quantiles of the printed tables, the closed-form CDFs of
    1 (Cauchy) and 2 degrees of freedom, and Welch's test on samples whose df is exactly 2."""
    import math
    import statistics

    from mtrain.evaluate.spread import spread, t_cdf, t_quantile, welch_test

    table = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 10: 2.228, 30: 2.042}
    for df, quantile in table.items():
        assert round(t_quantile(0.975, df), 3) == quantile, df
    assert t_quantile(0.025, 4) == pytest.approx(-2.776, abs=1e-3)
    for t in (-3.0, -0.4, 0.0, 0.7, 5.0):
        assert t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)
        assert t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-12)
    assert t_cdf(1.5, 2.5) == pytest.approx(1 - t_cdf(-1.5, 2.5), abs=1e-12)

    seeds = spread([27.52, 28.11, 28.55])
    assert seeds.mean == pytest.approx(28.06) and seeds.std == pytest.approx(statistics.stdev([27.52, 28.11, 28.55]))
    assert seeds.ci == pytest.approx(4.303 * seeds.std / math.sqrt(3), rel=1e-3)  # t, not 1.96
    assert (seeds.low, seeds.high) == (27.52, 28.55)
    assert spread([30.0]).ci is None and welch_test([30.0], [29.0, 31.0]) is None

    # Equal variances and two seeds each: df = 2, t = 1/sqrt(2).
    welch = welch_test([1.0, 3.0], [0.0, 2.0])
    t = 1 / math.sqrt(2)
    assert welch.df == pytest.approx(2) and welch.t == pytest.approx(t)
    assert welch.p_value == pytest.approx(2 * (0.5 - t / (2 * math.sqrt(2 + t * t))))


def seeded_run(root: Path, name: str, overrides: list, hyps: list | None, refs: list, seed_in_config=None) -> Path:
    """A fake run: overrides, metrics.json with the real BLEU/chrF of its hypotheses, eval/test.hyp."""
    from sacrebleu.metrics import BLEU, CHRF

    run = root / name
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides), encoding="utf-8")
    test = {}
    if hyps is not None:
        (run / "eval").mkdir()
        (run / "eval" / "test.hyp").write_text("\n".join(hyps) + "\n", encoding="utf-8")
        test = {"bleu": BLEU().corpus_score(hyps, [refs]).score, "chrf": CHRF().corpus_score(hyps, [refs]).score}
    (run / "metrics.json").write_text(json.dumps({"test": test, "updates": 100}), encoding="utf-8")
    if seed_in_config is not None:
        (run / "config.yaml").write_text(f"seed: {seed_in_config}\n", encoding="utf-8")
    return run


def noisy(refs: list, noise: float, seed: int) -> list:
    rng = random.Random(seed)
    return [" ".join(w if rng.random() > noise else rng.choice(WORDS) for w in ref.split()) for ref in refs]


def make_seeded_sweep(root: Path, arms: dict) -> tuple[Path, list]:
    """{value of model.x: [noise of each seed]}: runs 0, 1, ... with `model.x=VALUE seed=S`."""
    rng = random.Random(7)
    refs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))) for _ in range(150)]
    (root / "test.en").write_text("\n".join(refs) + "\n", encoding="utf-8")
    sweep, index = root / "sweep", 0
    for value, noises in arms.items():
        for seed, noise in enumerate(noises, start=1):
            overrides = [f"model.x={value}", f"seed={seed}", "train.max_updates=100", f"hydra.job.num={index}"]
            seeded_run(sweep, str(index), overrides, noisy(refs, noise, 100 * index + seed), refs)
            index += 1
    return sweep, refs


def test_runs_of_one_configuration_across_seeds_are_one_arm(tmp_path):
    from mtrain.evaluate.arms import group_arms, run_seed

    sweep, refs = make_seeded_sweep(tmp_path, {"a": [0.2, 0.2, 0.2], "b": [0.3, 0.3]})
    arms = group_arms(discover_runs(str(sweep)))
    assert [(arm.name, arm.label, [run.name for run in arm.runs], arm.seeds) for arm in arms] == [
        ("0", "model.x=a", ["0", "1", "2"], [1, 2, 3]),
        ("3", "model.x=b", ["3", "4"], [1, 2]),
    ]
    # The seed of config.yaml wins (a run of seed 1 has no seed= override).
    other = tmp_path / "other"
    plain = seeded_run(other, "standard", ["model.x=a"], None, refs, seed_in_config=1)
    second = seeded_run(other, "standard_seed2", ["model.x=a", "seed=2"], None, refs, seed_in_config=2)
    assert run_seed(discover_runs(str(plain))[0]) == 1
    cut_short = seeded_run(other, "cut_short", ["model.x=a", "seed=3"], None, refs)
    (cut_short / "config.yaml").write_text("seed: [1\n", encoding="utf-8")  # unreadable: the override says 3
    assert run_seed(discover_runs(str(cut_short))[0]) == 3
    pair = group_arms(discover_runs(f"{plain},{second}"))
    assert len(pair) == 1 and pair[0].seeds == [1, 2] and pair[0].label == "model.x=a"  # (one arm: all it sets)
    # Runs that repeat a seed, or whose seed is unknown, are not replicates: each is its own arm.
    same_seed = seeded_run(other, "again", ["model.x=a", "seed=2"], None, refs)
    assert [len(arm.runs) for arm in group_arms(discover_runs(f"{plain},{second},{same_seed}"))] == [1, 1, 1]
    bare = [seeded_run(other, name, [], None, refs) for name in ("p", "q")]
    assert [arm.name for arm in group_arms(discover_runs(",".join(map(str, bare))))] == ["p", "q"]


def test_arms_are_compared_over_seeds_not_seed_against_seed(tmp_path, monkeypatch, capsys):
    """Two arms of three seeds: no run-against-run bootstrap; per arm mean ± sd [t interval] of its
    seeds' scores, and against the baseline arm Δ with the bootstrap's interval and p and Welch's p."""
    import statistics

    from mtrain.cli import main as cli
    from mtrain.evaluate.spread import t_quantile

    sweep, refs = make_seeded_sweep(tmp_path, {"a": [0.15, 0.2, 0.25], "b": [0.35, 0.4, 0.45]})
    runs = discover_runs(str(sweep))
    comparison = compare_runs(runs, None, metrics=["bleu"], num_samples=200)  # references: given below
    assert comparison.paired == {} and "compared arm against arm over their seeds" in comparison.bootstrap_note
    assert not comparison.over_seeds.bootstrap and any(
        "pass the references with ref=FILE" in n for n in comparison.over_seeds.notes
    )

    comparison = compare_runs(runs, [refs], metrics=["bleu"], num_samples=200)
    over = comparison.over_seeds
    table = over.table()
    assert table.headers == [
        "arm",
        "differs",
        "seeds",
        "BLEU mean ± sd [95% CI]",
        "Δ BLEU [95% CI]",
        "p (BLEU, bootstrap)",
        "p (BLEU, Welch)",
    ]
    scores = {arm: [run.score("test") for run in runs if run.overrides["model.x"] == arm] for arm in "ab"}
    mean, sd = statistics.mean(scores["a"]), statistics.stdev(scores["a"])
    half = t_quantile(0.975, 2) * sd / 3**0.5
    assert table.rows[0] == [
        "0 (baseline)",
        "model.x=a",
        "1, 2, 3",
        f"{mean:.2f} ± {sd:.2f} [{mean - half:.2f}, {mean + half:.2f}]",
        "-",
        "-",
        "-",
    ]
    second = table.rows[1]
    assert second[:3] == ["3", "model.x=b", "1, 2, 3"]
    difference = statistics.mean(scores["b"]) - mean
    low, high = (float(x) for x in second[4].split(" [")[1].rstrip("]").split(", "))
    assert second[4].startswith(f"{difference:+.2f} [") and low < difference < high < 0
    assert float(second[5]) < 0.05 and float(second[6]) < 0.05  # twice the noise: a real difference
    assert over.bootstrap["3"]["bleu"].mean == pytest.approx(statistics.mean(scores["b"]))

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(
        sys, "argv", ["mtrain", "eval", f"runs={sweep}", f"ref={tmp_path / 'test.en'}", "bootstrap_samples=50"]
    )
    cli.main()
    printed = capsys.readouterr().out
    assert "Over seeds (2 arms):" in printed and "p (chrF, Welch)" in printed
    assert "drawing the test sentences and each arm's seeds with replacement" in printed
    assert "p (BLEU)" not in printed  # no run-against-run column


def test_the_arm_bootstrap_counts_seed_variance_that_a_sentence_bootstrap_misses(tmp_path):
    """Seeds that scatter widely around nearly the same quality: sacreBLEU's bootstrap of seed 1
    against seed 1 calls the gap significant; resampling the seeds too does not."""
    from mtrain.evaluate.arm_bootstrap import arm_bootstrap

    rng = random.Random(11)
    refs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 12))) for _ in range(300)]
    arm_a = [noisy(refs, noise, seed) for seed, noise in ((1, 0.1), (2, 0.3), (3, 0.5))]
    arm_b = [noisy(refs, noise, seed) for seed, noise in ((4, 0.15), (5, 0.35), (6, 0.55))]
    seed_blind, _ = paired_bootstrap([("a", arm_a[0]), ("b", arm_b[0])], [refs], ["bleu"], SAMPLES)
    assert seed_blind["b"]["bleu"].p_value < 0.05

    results = arm_bootstrap([("a", arm_a), ("b", arm_b)], [refs], ["bleu"], SAMPLES)
    result = results["b"]["bleu"]
    assert result.difference < 0 and result.low < 0 < result.high and result.p_value > 0.2
    # One seed per arm: only the sentences are resampled, and the gap is significant again.
    single = arm_bootstrap([("a", arm_a[:1]), ("b", arm_b[:1])], [refs], ["bleu"], SAMPLES)["b"]["bleu"]
    assert single.p_value < 0.05 and single.high < 0
    same = arm_bootstrap([("a", arm_a), ("c", list(arm_a))], [refs], ["bleu"], 20)["c"]["bleu"]
    assert same.identical_to_baseline and same.p_value is None
