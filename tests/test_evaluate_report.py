"""mtrain.evaluate.report and .sweep: `mtrain eval run=...` reports and `mtrain report SWEEP_DIR`."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from mtrain.decode.engines.threads import DEFAULT_DECODE_THREADS
from mtrain.errors import MtrainError
from mtrain.evaluate.metrics import score_files
from mtrain.runtime import resolve_precision
from tests.warm_process import run_mtrain, run_python

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_cli(monkeypatch, *argv: str) -> None:
    from mtrain.cli import main as cli

    monkeypatch.setattr(sys, "argv", ["mtrain", *argv])
    cli.main()


# --------------------------------------------------------------------------- mtrain eval run=


def test_eval_run_writes_a_complete_report(tiny_run, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    run_cli(monkeypatch, "eval", f"run={tiny_run}", "split=test", "decode.beam=2", "device=cpu", "chrf_word_order=2")
    printed = capsys.readouterr().out
    eval_dir = tiny_run / "eval"
    assert "the report is test.chrf++.*" in printed  # chrF++, not the default chrF: a report of its own
    report = json.loads((eval_dir / "test.chrf++.json").read_text(encoding="utf-8"))
    hyps = (eval_dir / "test.chrf++.hyp").read_text(encoding="utf-8").splitlines()
    corpus = Path(OmegaConf.load(tiny_run / "config.yaml").data.local_dir)

    # Metrics with signatures, equal to scoring the saved hypotheses against the test file.
    expected = score_files(eval_dir / "test.chrf++.hyp", [corpus / "test.en"], chrf_word_order=2)
    assert report["metrics"] == expected
    assert set(report["metrics"]) == {"bleu", "chrf", "ter"}
    assert report["metrics"]["chrf"]["name"] == "chrF2++"
    assert all(m["signature"].startswith("nrefs:1|") for m in report["metrics"].values())
    # Checkpoint, decoding settings, data files with hashes, counts, time and speed.
    assert report["checkpoint"]["path"].endswith("best.pt") and report["checkpoint"]["update"] == 20
    assert report["checkpoint"]["averaged_from"] is None
    assert report["decode"]["beam"] == 2 and report["decode"]["device"] == "cpu"
    # precision=auto resolves as the decoder does: bf16 on CPUs with bf16 matrix instructions.
    expected_precision = resolve_precision("auto", torch.device("cpu"))
    assert report["decode"]["precision"] == expected_precision and report["decode"]["engine"] == "torch"
    assert report["decode"]["threads"] == DEFAULT_DECODE_THREADS  # num_threads unset: the fixed default
    roles = {record["role"]: record for record in report["data"]}
    assert set(roles) == {"source", "reference", "hypotheses"}
    assert roles["source"]["path"] == str((corpus / "test.de").resolve())
    assert roles["reference"]["lines"] == 16 and len(roles["reference"]["sha256"]) == 64
    assert report["sentences"] == len(hyps) == 16
    assert report["decode_time_s"] > 0 and report["sentences_per_s"] > 0
    assert report["split"] == "test" and report["split_name"] == "test" and report["language_pair"] == "de-en"
    assert report["scoring"] == {"tokenize": "13a", "lowercase": False, "chrf_word_order": 2}
    # The Markdown report says the same; the terminal shows the table.
    markdown = (eval_dir / "test.chrf++.md").read_text(encoding="utf-8")
    for needle in (
        "| BLEU |",
        report["metrics"]["bleu"]["signature"],
        "best.pt",
        "beam=2",
        f"threads={DEFAULT_DECODE_THREADS}",
        roles["reference"]["sha256"],
        "**Sentences**: 16",
        "sentences/s",
    ):
        assert needle in markdown, needle
    assert report["metrics"]["ter"]["signature"] in printed
    assert list(tmp_path.iterdir()) == []  # nothing written outside the run directory


def test_eval_with_averaged_checkpoints(tiny_run, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    run_cli(
        monkeypatch,
        "eval",
        f"run={tiny_run}",
        "split=valid",
        "average_last=2",
        "decode.beam=1",
        "device=cpu",
        "metrics=[bleu]",
    )
    report = json.loads((tiny_run / "eval" / "valid.json").read_text(encoding="utf-8"))
    assert [Path(p).name for p in report["checkpoint"]["averaged_from"]] == ["update_20.pt", "update_30.pt"]
    assert report["checkpoint"]["path"].endswith("average_last2.pt") and report["sentences"] == 12
    assert set(report["metrics"]) == {"bleu"}
    assert "averaged update_20.pt, update_30.pt" in capsys.readouterr().out


def test_eval_refuses_a_split_the_run_lacks_before_writing_an_average(tiny_run, tmp_path):
    import shutil

    from mtrain.cli.evaluate import evaluate_run
    from mtrain.config import EvalConfig

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run, ignore=shutil.ignore_patterns("eval", "average_*"))
    config = OmegaConf.load(run / "config.yaml")
    config.data.splits.test = None  # trained with data.splits.test=null
    (run / "config.yaml").write_text(OmegaConf.to_yaml(config), encoding="utf-8")
    cfg = OmegaConf.structured(EvalConfig)
    cfg.run, cfg.device, cfg.split, cfg.average_last = str(run), "cpu", "test", 2
    with pytest.raises(MtrainError, match="trained without a test split"):
        evaluate_run(cfg)
    assert not list((run / "checkpoints").glob("average_*"))


def test_eval_run_bad_inputs(tiny_run, tmp_path, monkeypatch, capsys):
    from mtrain.cli.evaluate import evaluate_run
    from mtrain.config import EvalConfig

    cfg = OmegaConf.structured(EvalConfig)
    cfg.device = "cpu"
    no_checkpoints = tmp_path / "empty_run"
    no_checkpoints.mkdir()
    cfg.run = str(no_checkpoints)
    with pytest.raises(MtrainError, match="no checkpoints in"):
        evaluate_run(cfg)
    cfg.run = str(tmp_path / "missing")
    with pytest.raises(MtrainError, match="no such run directory"):
        evaluate_run(cfg)
    cfg.run, cfg.average_last = str(tiny_run), 5
    with pytest.raises(MtrainError, match="5 checkpoints asked for but only 3"):
        evaluate_run(cfg)
    cfg.average_last, cfg.metrics = 0, ["bleu", "bertscore"]
    with pytest.raises(MtrainError, match="unknown metric 'bertscore'.*bleu, chrf, ter"):
        evaluate_run(cfg)

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        run_cli(monkeypatch, "eval", f"run={no_checkpoints}")
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith(f"mtrain: error: run={no_checkpoints}: no checkpoints")


@contextlib.contextmanager
def read_only(directory: Path) -> Iterator[None]:
    """`directory` read-only as the kernel enforces it: a read-only bind mount when we are root
    (tests run as root, and root ignores permission bits: every write fails with EROFS, as on a
    read-only share), else its directories' write bits removed."""
    if os.geteuid() != 0:
        directories = [directory, *(p for p in directory.rglob("*") if p.is_dir())]
        for path in directories:
            path.chmod(0o555)
        try:
            yield
        finally:
            for path in directories:
                path.chmod(0o755)
        return
    if subprocess.run(["mount", "--bind", str(directory), str(directory)], capture_output=True).returncode:
        pytest.skip("root, but no bind mount here (no CAP_SYS_ADMIN): cannot make a read-only directory")
    try:
        if subprocess.run(["mount", "-o", "remount,bind,ro", str(directory)], capture_output=True).returncode:
            pytest.skip("cannot remount a bind mount read-only here")
        yield
    finally:
        subprocess.run(["umount", str(directory)], check=True)


def mtrain_command(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return run_mtrain(*args, text=True, cwd=cwd, env=env, timeout=300)


def test_eval_of_a_read_only_run_refuses_before_any_work_and_writes_to_out(tiny_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run, ignore=shutil.ignore_patterns("eval", "average_last*"))
    out = tmp_path / "reports"
    quick = ["split=valid", "device=cpu", "decode.beam=1", "metrics=[bleu]", "num_threads=1"]
    with read_only(run):
        refused = mtrain_command("eval", f"run={run}", *quick, cwd=tmp_path)
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr.splitlines() == [
            f"mtrain: error: run={run}: {run / 'eval'} is not writable "
            f"({run} {'is on a read-only file system' if os.geteuid() == 0 else 'denies writing'}); "
            "write the report elsewhere with out=DIR"
        ]
        assert "decoding" not in refused.stdout  # refused before the model was loaded

        # Averaging writes a checkpoint into the run: also refused at once, with the advice that helps.
        refused = mtrain_command("eval", f"run={run}", *quick, "average_last=1", cwd=tmp_path)
        assert refused.returncode == 2, refused.stderr
        assert len(refused.stderr.splitlines()) == 1 and refused.stderr.startswith(f"mtrain: error: run={run}: ")
        assert "write the report and average_last1.pt elsewhere with out=DIR" in refused.stderr
        assert "train.resume" not in refused.stderr and "averaged" not in refused.stdout

        done = mtrain_command("eval", f"run={run}", *quick, "average_last=2", f"out={out}", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    report = json.loads((out / "valid.json").read_text(encoding="utf-8"))
    assert report["run"] == str(run.resolve()) and report["sentences"] == 12
    assert report["checkpoint"]["path"] == str(out / "average_last2.pt") and (out / "average_last2.pt").is_file()
    assert sorted(p.name for p in out.iterdir()) == ["average_last2.pt", "valid.hyp", "valid.json", "valid.md"]
    assert not (run / "eval").exists() and not list(run.glob("checkpoints/average*"))
    assert sorted(tmp_path.iterdir()) == sorted([run, out])  # nothing else written


def test_hypotheses_scored_against_a_runs_split(tiny_run, tmp_path, monkeypatch, capsys):
    corpus = Path(OmegaConf.load(tiny_run / "config.yaml").data.local_dir)
    monkeypatch.chdir(tmp_path)
    run_cli(monkeypatch, "eval", f"hyp={corpus / 'test.en'}", f"run={tiny_run}", "metrics=[bleu]")
    assert "100.00" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        run_cli(monkeypatch, "eval", f"hyp={corpus / 'val.en'}", f"run={tiny_run}")
    assert "has 12 lines but" in capsys.readouterr().err


def _tsv_rows(path: Path) -> list:
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[0].split("\t") == ["line", "bleu", "chrf", "model_score", "source", "hypothesis", "reference"]
    return [line.split("\t") for line in lines[1:]]


def test_eval_run_per_sentence_writes_the_tsv_and_lists_the_worst_lines(tiny_run, monkeypatch, capsys, tmp_path):
    from sacrebleu.metrics import BLEU, CHRF

    from mtrain.checkpoint.files import load_run
    from mtrain.config import DecodeConfig
    from mtrain.decode import translate_sentences

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "reports"
    run_cli(
        monkeypatch,
        "eval",
        f"run={tiny_run}",
        "split=test",
        "decode.beam=2",
        "device=cpu",
        "precision=fp32",
        "per_sentence=true",
        "worst_lines=3",
        "chrf_word_order=2",
        "lowercase=true",
        f"out={out}",
    )
    assert "sentence scores: " in capsys.readouterr().out
    name = "test.lc.chrf++"  # lowercased chrF++: the report names its scoring
    assert sorted(p.name for p in out.iterdir()) == [
        f"{name}.{kind}" for kind in ("hyp", "json", "md", "sentences.tsv")
    ]
    corpus = Path(OmegaConf.load(tiny_run / "config.yaml").data.local_dir)
    sources = (corpus / "test.de").read_text(encoding="utf-8").splitlines()
    refs = (corpus / "test.en").read_text(encoding="utf-8").splitlines()
    hyps = (out / f"{name}.hyp").read_text(encoding="utf-8").splitlines()
    rows = _tsv_rows(out / f"{name}.sentences.tsv")
    assert [int(row[0]) for row in rows] == list(range(1, 17))
    assert [row[4:] for row in rows] == [[s, h, r] for s, h, r in zip(sources, hyps, refs, strict=True)]
    # sacreBLEU's own sentence scorers, with the corpus metrics' settings.
    bleu, chrf = BLEU(lowercase=True, effective_order=True), CHRF(word_order=2, lowercase=True)
    assert [float(row[1]) for row in rows] == pytest.approx(
        [bleu.sentence_score(h, [r]).score for h, r in zip(hyps, refs, strict=True)], abs=5e-5
    )
    assert [float(row[2]) for row in rows] == pytest.approx(
        [chrf.sentence_score(h, [r]).score for h, r in zip(hyps, refs, strict=True)], abs=5e-5
    )
    # The model's score: the best hypothesis' length-normalised log-probability, as decoding gives it.
    loaded = load_run(tiny_run, "best")
    decoded = translate_sentences(loaded.model, loaded.tokenizer, sources, DecodeConfig(beam=2), "cpu")
    assert [h[0].text for h in decoded] == hyps
    assert [float(row[3]) for row in rows] == pytest.approx([h[0].score for h in decoded], abs=1e-4)

    report = json.loads((out / f"{name}.json").read_text(encoding="utf-8"))
    assert report["per_sentence"]["path"] == str((out / f"{name}.sentences.tsv").resolve())
    worst = report["per_sentence"]["worst_lines"]
    lowest = sorted(rows, key=lambda row: (float(row[1]), float(row[2]), int(row[0])))[:3]
    assert [w["line"] for w in worst] == [int(row[0]) for row in lowest]
    assert (
        max(w["bleu"] for w in worst)
        <= min(float(row[1]) for row in rows if int(row[0]) not in {w["line"] for w in worst}) + 5e-5
    )
    markdown = (out / f"{name}.md").read_text(encoding="utf-8")
    assert "## The 3 lines of lowest sentence-BLEU" in markdown and str(out / f"{name}.sentences.tsv") in markdown
    assert all(f"| {w['line']} | {w['bleu']:.2f} | {w['chrf']:.2f} |" in markdown for w in worst)

    # Without per_sentence, an earlier TSV there goes: it scored the hypotheses replaced now.
    run_cli(
        monkeypatch,
        "eval",
        f"run={tiny_run}",
        "split=test",
        "decode.beam=1",
        "device=cpu",
        f"out={out}",
        "metrics=[bleu]",
        "chrf_word_order=2",
        "lowercase=true",
    )
    assert not (out / f"{name}.sentences.tsv").exists()
    assert "per_sentence" not in json.loads((out / f"{name}.json").read_text(encoding="utf-8"))


def test_reports_of_other_scoring_settings_keep_their_own_names(tiny_run, monkeypatch, capsys, tmp_path):
    """lowercase=true (or tokenize=, chrf_word_order=) writes test.lc.* beside test.*: the
    default report, which `mtrain report` and the comparison read, is never replaced by it."""
    from mtrain.evaluate.report import scored_name
    from mtrain.run_summary import load_run_summary

    out = tmp_path / "run"
    shutil.copytree(tiny_run, out, ignore=shutil.ignore_patterns("eval", "average_*"))
    common = ["eval", f"run={out}", "split=test", "decode.beam=1", "device=cpu", "metrics=[bleu,chrf]"]
    run_cli(monkeypatch, *common)
    default = (out / "eval" / "test.json").read_bytes()
    capsys.readouterr()
    run_cli(monkeypatch, *common, "lowercase=true")
    printed = capsys.readouterr().out
    assert "scoring with lowercase=true: the report is test.lc.*" in printed
    assert (out / "eval" / "test.json").read_bytes() == default
    lowercased = json.loads((out / "eval" / "test.lc.json").read_text(encoding="utf-8"))
    assert lowercased["scoring"]["lowercase"] is True and (out / "eval" / "test.lc.md").is_file()
    assert scored_name("test.de-en", "intl", True, 2) == "test.de-en.lc.tok-intl.chrf++"
    assert scored_name("test", "13a", False, 0) == "test"
    summary = load_run_summary(out)
    assert summary.score("test", "chrf") == json.loads(default)["metrics"]["chrf"]["score"]


def test_eval_hyp_per_sentence_writes_beside_the_hypotheses_or_into_out(tiny_run, tmp_path, monkeypatch, capsys):
    from sacrebleu.metrics import BLEU

    hyp, ref = tmp_path / "sys.en", tmp_path / "ref.en"
    hyps = ["a man\twith a hat", "two dogs", "the cat sits on the mat"]
    refs = ["a man with a hat", "two dogs run in the park", "the cat sits on the mat"]
    hyp.write_text("".join(f"{line}\n" for line in hyps), encoding="utf-8")
    ref.write_text("".join(f"{line}\n" for line in refs), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    run_cli(monkeypatch, "eval", f"hyp={hyp}", f"ref={ref}", "per_sentence=true", "worst_lines=1", "metrics=[bleu]")
    printed = capsys.readouterr().out
    rows = _tsv_rows(tmp_path / "sys.en.sentences.tsv")
    bleu = BLEU(effective_order=True)
    assert [float(row[1]) for row in rows] == pytest.approx(
        [bleu.sentence_score(h, [r]).score for h, r in zip(hyps, refs, strict=True)], abs=5e-5
    )
    assert [row[3:6] for row in rows] == [
        ["", "", "a man\\twith a hat"],
        ["", "", "two dogs"],
        ["", "", "the cat sits on the mat"],
    ]  # no model score, no sources
    assert "two dogs" in printed and str(tmp_path / "sys.en.sentences.tsv") in printed

    # References (and sources) from a run's split; the TSV into out=.
    corpus = Path(OmegaConf.load(tiny_run / "config.yaml").data.local_dir)
    sources = (corpus / "val.de").read_text(encoding="utf-8").splitlines()
    valid_hyps = [" ".join(line.split()[:-1]) for line in (corpus / "val.en").read_text(encoding="utf-8").splitlines()]
    (tmp_path / "valid.en").write_text("".join(f"{line}\n" for line in valid_hyps), encoding="utf-8")
    out = tmp_path / "scores"
    run_cli(
        monkeypatch,
        "eval",
        f"hyp={tmp_path / 'valid.en'}",
        f"run={tiny_run}",
        "split=valid",
        "per_sentence=true",
        f"out={out}",
    )
    assert [p.name for p in out.iterdir()] == ["valid.en.sentences.tsv"]
    rows = _tsv_rows(out / "valid.en.sentences.tsv")
    assert [row[4:6] for row in rows] == [[s, h] for s, h in zip(sources, valid_hyps, strict=True)]
    capsys.readouterr()


def test_data_records_count_the_text_lines_of_gzip_files(tmp_path):
    """A .gz holds few newline bytes of its own: its lines are those of the text inside."""
    import gzip

    from mtrain.evaluate.references import file_record

    rng = random.Random(0)
    text = "".join(" ".join(str(rng.random()) for _ in range(5)) + "\n" for _ in range(1000))
    with gzip.open(tmp_path / "test.en.gz", "wt", encoding="utf-8") as handle:
        handle.write(text + "no newline at the end")
    (tmp_path / "test.en").write_text(text, encoding="utf-8")
    assert file_record(tmp_path / "test.en.gz", "reference")["lines"] == 1001
    assert file_record(tmp_path / "test.en", "reference")["lines"] == 1000


def test_write_report_holds_every_field(tmp_path):
    from mtrain.evaluate.report import write_report

    report = {
        "run": "/runs/x",
        "split": "test",
        "split_name": "test_2016_flickr",
        "checkpoint": {
            "path": "/runs/x/checkpoints/average_last2.pt",
            "which": "average",
            "update": 30,
            "averaged_from": ["/runs/x/checkpoints/update_20.pt", "/runs/x/checkpoints/update_30.pt"],
        },
        "decode": {"beam": 5, "length_penalty": 1.0, "device": "cpu", "precision": "fp32", "engine": "torch"},
        "data": [{"role": "reference", "path": "/data/test.en", "sha256": "ab" * 32, "lines": 2}],
        "sentences": 2,
        "decode_time_s": 0.5,
        "sentences_per_s": 4.0,
        "target_tokens_per_s": 40.0,
        "metrics": {
            "bleu": {
                "name": "BLEU",
                "score": 12.5,
                "signature": "nrefs:1|tok:13a",
                "text": "BLEU|nrefs:1|tok:13a = 12.50",
            }
        },
        "scoring": {"tokenize": "13a", "lowercase": False, "chrf_word_order": 0},
        "mtrain_version": "0.1.0",
        "created": "2026-01-01T00:00:00+00:00",
    }
    paths = write_report(tmp_path / "eval", "test", report, ["a b", "c"])
    assert paths["hyp"].read_text(encoding="utf-8") == "a b\nc\n"
    saved = json.loads(paths["json"].read_text(encoding="utf-8"))
    assert saved["data"][-1]["role"] == "hypotheses" and saved["data"][-1]["lines"] == 2
    markdown = paths["md"].read_text(encoding="utf-8")
    for needle in (
        "| BLEU | 12.50 | nrefs:1|tok:13a |".replace("|tok", "\\|tok"),
        "average of update_20.pt, update_30.pt",
        "beam=5",
        "ab" * 32,
        "/data/test.en",
        "0.50 s",
    ):
        assert needle in markdown, needle
    assert not list((tmp_path / "eval").glob(".*.tmp"))


# --------------------------------------------------------------------------- mtrain report


def make_fake_run(run: Path, overrides: list, losses: list, bleus: list, metrics: dict) -> None:
    from torch.utils.tensorboard import SummaryWriter

    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides), encoding="utf-8")
    (run / "metrics.json").write_text(json.dumps(metrics), encoding="utf-8")
    writer = SummaryWriter(log_dir=str(run / "tb"))
    for step, loss in losses:
        writer.add_scalar("train/loss", loss, step)
    for step, bleu in bleus:
        writer.add_scalar("valid/bleu", bleu, step)
    writer.close()


@pytest.fixture
def fake_sweep(tmp_path) -> Path:
    sweep = tmp_path / "multirun" / "12-00-00"
    make_fake_run(
        sweep / "0",
        ["model.norm_position=pre", "train.max_updates=40"],
        [(10, 6.0), (20, 5.0), (30, 4.5), (40, 4.0)],
        [(20, 8.0), (40, 12.5)],
        {
            "valid": {"best_bleu": 12.5, "best_update": 40},
            "test": {"bleu": 11.75, "chrf": 40.0},
            "updates": 40,
            "train_time_s": 30.0,
            "best_update": 40,
            "diverged": False,
            "final_train_loss": 4.0,
        },
    )
    make_fake_run(
        sweep / "1",
        ["model.norm_position=post", "train.max_updates=40"],
        [(10, 6.5), (20, 90.0)],
        [],
        {"updates": 20, "train_time_s": 14.0, "diverged": True},
    )
    return sweep


def test_report_builds_table_and_plots(fake_sweep, monkeypatch, capsys, tmp_path):
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    run_cli(monkeypatch, "report", str(fake_sweep))
    out_dir = fake_sweep / "report"
    markdown = (out_dir / "report.md").read_text(encoding="utf-8")
    table = [line for line in markdown.splitlines() if line.startswith("|")]
    assert table[0] == (
        "| run | differs | val BLEU | test BLEU | test chrF | final loss | diverged | updates | train time |"
    )
    assert table[2] == "| 0 | model.norm_position=pre | 12.50 | 11.75 | 40.00 | 4.000 | no | 40 | 30s |"
    assert table[3] == "| 1 | model.norm_position=post | - | - | - | - | yes | 20 | 14s |"
    assert "`train.max_updates=40`" in markdown  # shared overrides are stated once, not per row
    for plot in ("train_loss.png", "valid_bleu.png"):
        assert f"]({plot})" in markdown
        data = (out_dir / plot).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000
    assert "run 1: no valid/bleu events" in markdown
    assert "model.norm_position=post" in capsys.readouterr().out
    assert list(workdir.iterdir()) == []


def test_report_reads_curves_from_tensorboard(fake_sweep):
    from mtrain.evaluate.curves import read_scalars

    curves = read_scalars(fake_sweep / "0")
    assert curves["train/loss"] == [(10, 6.0), (20, 5.0), (30, 4.5), (40, 4.0)]
    assert curves["valid/bleu"] == [(20, 8.0), (40, 12.5)]
    assert read_scalars(fake_sweep / "missing") == {"train/loss": [], "valid/bleu": []}


def test_report_of_a_run_list_needs_out(fake_sweep, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    runs = f"{fake_sweep / '0'},{fake_sweep / '1'}"
    with pytest.raises(SystemExit):
        run_cli(monkeypatch, "report", runs)
    assert "out=DIR" in capsys.readouterr().err
    run_cli(monkeypatch, "report", f"sweep={runs}", f"out={tmp_path / 'rep'}")
    assert (tmp_path / "rep" / "report.md").is_file()
    with pytest.raises(SystemExit):
        run_cli(monkeypatch, "report", str(tmp_path / "nothing"))
    assert "no such directory" in capsys.readouterr().err


def test_report_adds_the_paired_bootstrap_when_runs_saved_hypotheses(fake_sweep, tmp_path, monkeypatch, capsys):
    from omegaconf import OmegaConf

    from mtrain.config import DataConfig

    refs = [f"a small dog number {i} runs across the green grass ." for i in range(30)]
    data_dir = tmp_path / "corpus"
    data_dir.mkdir()
    for split in ("train", "val", "test_2016_flickr"):  # the default split names
        (data_dir / f"{split}.en").write_text("".join(r + "\n" for r in refs), encoding="utf-8")
        (data_dir / f"{split}.de").write_text("".join(f"satz {i}\n" for i in range(30)), encoding="utf-8")
    data = OmegaConf.structured(DataConfig(local_dir=str(data_dir)))
    worse = [r.replace("green", "red").replace("runs", "walks") if i % 2 else r for i, r in enumerate(refs)]
    for job, hyps in (("0", refs), ("1", worse)):
        (fake_sweep / job / "config.yaml").write_text(OmegaConf.to_yaml({"data": data}), encoding="utf-8")
        (fake_sweep / job / "eval").mkdir()
        (fake_sweep / job / "eval" / "test.hyp").write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    monkeypatch.chdir(tmp_path)

    run_cli(monkeypatch, "report", str(fake_sweep), "bootstrap_samples=200")
    markdown = (fake_sweep / "report" / "report.md").read_text(encoding="utf-8")
    table = [line.split(" | ") for line in markdown.splitlines() if line.startswith("|")]
    assert table[0][-4:] == ["BLEU μ ± 95% CI", "p (BLEU)", "chrF μ ± 95% CI", "p (chrF) |"]
    assert table[2][0] == "| 0 (baseline)" and table[2][-3] == "-"  # no p-value against itself
    assert table[2][-4].startswith("100.00 ± 0.00")
    assert float(table[3][-3]) < 0.05  # half the sentences lost two words: a real difference
    assert "Paired bootstrap resampling (200 resamples" in markdown and "BLEU signature: nrefs:1|" in markdown

    run_cli(monkeypatch, "report", str(fake_sweep), "baseline=1", "bootstrap_samples=200")
    table = [line for line in (fake_sweep / "report" / "report.md").read_text().splitlines() if line.startswith("|")]
    assert table[2].startswith("| 1 (baseline)")
    run_cli(monkeypatch, "report", str(fake_sweep), "bootstrap_samples=0")
    assert "p (BLEU)" not in (fake_sweep / "report" / "report.md").read_text()
    with pytest.raises(SystemExit):
        run_cli(monkeypatch, "report", str(fake_sweep), "baseline=7")
    assert "7" in capsys.readouterr().err


def test_a_failed_sweep_job_is_recorded_and_the_sweep_goes_on_then_exits_non_zero(tiny_run, tmp_path):
    """A real `-m` sweep through the command, whose job 0 fails: job 1 still runs, the failure
    is in 0/failed.json, and the sweep's exit status says that something failed."""
    sweep, run = tmp_path / "sweep", tmp_path / "run"
    shutil.copytree(tiny_run, run, ignore=shutil.ignore_patterns("eval", "average_last*"))
    result = mtrain_command(
        "eval",
        "-m",
        f"run={run}",
        "split=valid",
        "checkpoint=nonexistent,best",
        "device=cpu",
        "decode.beam=1",
        "metrics=[bleu]",
        "num_threads=1",
        f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
    )
    errors = [line for line in result.stderr.splitlines() if line.startswith("mtrain: error:")]
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert errors[0].startswith("mtrain: error: checkpoint=nonexistent: no such file")
    assert errors[-1] == (
        f"mtrain: error: 1 of 2 sweep jobs failed: job 0 (checkpoint=nonexistent); each job's "
        f"reason is above and in its failed.json (`mtrain report {sweep}` lists them)"
    )
    record = json.loads((sweep / "0" / "failed.json").read_text(encoding="utf-8"))
    assert record["job"] == 0 and "checkpoint=nonexistent" in record["overrides"]
    assert record["error"] == errors[0].removeprefix("mtrain: error: ")
    assert (run / "eval" / "valid.json").is_file() and not (sweep / "1" / "failed.json").exists()  # job 1 ran


def test_report_and_comparison_list_failed_jobs_with_their_reasons(fake_sweep, tmp_path, monkeypatch, capsys):
    reason = (
        "data.splits.valid=val: line 3 has 19 source tokens; the model embeds at most 16 positions "
        "(model.max_positions); shorten or remove that line, or raise model.max_positions"
    )
    failed = fake_sweep / "2"
    failed.mkdir()
    (failed / "train.log").write_text("", encoding="utf-8")  # Hydra's log: all a job has before mtrain writes
    (failed / "failed.json").write_text(
        json.dumps(
            {  # as mtrain.cli.common writes it
                "job": 2,
                "overrides": ["model.norm_position=pre", "train.max_updates=40", "model.max_positions=16"],
                "error": reason,
                "exception": "MtrainError",
            }
        ),
        encoding="utf-8",
    )
    monkeypatch.chdir(tmp_path)
    run_cli(monkeypatch, "report", str(fake_sweep), "bootstrap_samples=0")
    markdown = (fake_sweep / "report" / "report.md").read_text(encoding="utf-8")
    line = f"run 2 (model.norm_position=pre model.max_positions=16) failed: {reason}"
    assert "3 runs, 1 of them failed (see below)." in markdown
    assert f"## Failed jobs\n\n- {line}\n" in markdown
    assert "run 2: no metrics.json" not in markdown  # its reason is known
    assert line in capsys.readouterr().out

    run_cli(monkeypatch, "eval", f"runs={fake_sweep}")
    assert line in capsys.readouterr().out


def test_scalar_table_script_prints_tags_at_updates(fake_sweep):

    from mtrain.evaluate.curves import scalar_tags

    assert scalar_tags(fake_sweep / "0") == ["train/loss", "valid/bleu"]
    script = Path(__file__).resolve().parents[1] / "scripts" / "scalar_table.py"
    result = run_python(
        str(script), str(fake_sweep / "0"), str(fake_sweep / "1"), "--tags", "train/*", "--steps", "10,25", text=True
    )
    assert result.returncode == 0, result.stderr
    rows = result.stdout.splitlines()
    assert rows[2] == "| train/loss | 0 | 6 | 5 (@20) |"  # 25 was not logged: the last value before it
    assert rows[3] == "| train/loss | 1 | 6.5 | 90 (@20) |"
    missing = run_python(str(script), str(fake_sweep / "0"), "--tags", "nope/*", "--steps", "1", text=True)
    assert missing.returncode != 0 and "no tag matches" in missing.stderr


def test_norm_gains_script_reads_a_runs_norms(tiny_run):
    script = Path(__file__).resolve().parents[1] / "scripts" / "norm_gains.py"
    result = run_python(str(script), str(tiny_run), "--checkpoint", "best", "--layers", "decoder.0", text=True)
    assert result.returncode == 0, result.stderr
    row = result.stdout.splitlines()[2]
    # An untrained model's gains are all exactly 1: mean 1, no spread (correlation undefined).
    assert row.startswith("| run | decoder.0 | self_attn 1.000, cross_attn 1.000, ffn 1.000 | self_attn 0.000,")
    missing = run_python(str(script), str(tiny_run), "--checkpoint", "best", "--layers", "decoder.7", text=True)
    assert missing.returncode != 0 and "no norms under decoder.7" in missing.stderr
    no_last = run_python(str(script), str(tiny_run), text=True)
    assert no_last.returncode != 0 and no_last.stderr.startswith("norm_gains: run=")  # one line, no traceback


def test_plots_of_short_runs_get_a_readable_axis():
    from mtrain.evaluate.curves import readable_limits

    low, high = readable_limits([0.004658, 0.004668])  # two validations of a 2-minute run
    assert high - low >= 0.5 and low < 0.004658 and high > 0.004668
    low, high = readable_limits([40.0, 20.0])  # a real spread is kept, with a margin
    assert low < 20.0 and high > 40.0 and high - low < 30.0


def test_plots_keep_legend_and_ticks_readable_for_any_labels(tmp_path):
    """The legend sits below the axes, outside them, its labels wrapped: the whole figure (title,
    legend, tick labels) lies inside the saved image, the legend covers neither the curves nor the
    axes' labels, and no two update ticks touch, at 100k updates too."""
    from mtrain.evaluate.curves import TRAIN_LOSS, curves_figure, update_label
    from mtrain.run_summary import RunSummary

    label = "data.local_dir=/home/someone/corpora/" + "a_very_long_directory_name/" * 8
    summaries = [
        RunSummary(f"2024-05-01_12-00-{i:02d}", tmp_path / str(i), {"sweep": label + str(i)}) for i in range(16)
    ]
    curves = {
        run.name: {TRAIN_LOSS: [(step, 9 - step / 20_000 - i / 10) for step in range(0, 120_001, 4000)]}
        for i, run in enumerate(summaries)
    }
    title = "Training loss (" + "/home/someone/multirun/2024-05-01/12-00-00" * 3 + ")"
    figure = curves_figure(summaries, curves, TRAIN_LOSS, ["sweep"], "training loss", title)
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    tight = figure.get_tightbbox(renderer).transformed(figure.dpi_scale_trans)
    page = figure.bbox
    assert page.x0 <= tight.x0 and tight.x1 <= page.x1 and page.y0 <= tight.y0 and tight.y1 <= page.y1, (tight, page)
    axes, legend = figure.axes[0], figure.legends[0]
    assert not legend.get_window_extent(renderer).overlaps(axes.get_tightbbox(renderer))
    assert axes.get_window_extent(renderer).height / figure.dpi > 3.5  # the curves keep their room
    ticks = sorted((t.get_window_extent(renderer) for t in axes.get_xticklabels() if t.get_text()), key=lambda b: b.x0)
    assert len(ticks) >= 3 and all(a.x1 < b.x0 for a, b in itertools.pairwise(ticks))
    assert [update_label(u) for u in (900, 15_000, 120_000, 2_500_000)] == ["900", "15k", "120k", "2.5M"]


def test_a_report_that_scores_differently_says_what_it_replaces(tmp_path):
    from mtrain.evaluate.report import replaced_report_note

    def report(bleu, update):
        return {
            "metrics": {"bleu": {"name": "BLEU", "score": bleu, "signature": "s", "text": "t"}},
            "checkpoint": {"path": f"/r/checkpoints/update_{update}.pt", "update": update},
            "decode": {"beam": 5},
            "data": [],
        }

    path = tmp_path / "eval" / "test.json"
    assert replaced_report_note(path, report(30.0, 200)) is None  # nothing there yet
    path.parent.mkdir()
    path.write_text(json.dumps(report(40.0, 300)), encoding="utf-8")
    note = replaced_report_note(path, report(30.0, 200))
    assert "replacing BLEU 40.00 (update_300.pt (update 300), beam 5) with 30.00 (update_200.pt" in note
    assert replaced_report_note(path, report(40.0, 300)) is None  # the same score: nothing to say


def test_eval_hyp_streamed_scores_equal_the_per_sentence_paths(tmp_path):
    """hyp= ref= alone is scored as the files are read (bounded memory); with per_sentence the
    lines are held: both give the same scores and file records."""
    from mtrain.cli.evaluate import score_hypotheses
    from mtrain.config import EvalConfig

    rng = random.Random(3)
    words = ["a", "man", "dog", "cat", "runs", "sits", "on", "the", "mat", "park", "two", "red"]
    hyp, ref = tmp_path / "sys.en", tmp_path / "ref.en"
    hyp.write_text("".join(" ".join(rng.choices(words, k=8)) + "\n" for _ in range(40)), encoding="utf-8")
    ref.write_text("".join(" ".join(rng.choices(words, k=8)) + "\n" for _ in range(40)), encoding="utf-8")
    streamed = score_hypotheses(EvalConfig(hyp=str(hyp), ref=[str(ref)]), log=lambda _: None)
    held = score_hypotheses(
        EvalConfig(hyp=str(hyp), ref=[str(ref)], per_sentence=True, out=str(tmp_path / "out")), log=lambda _: None
    )
    assert streamed["metrics"] == held["metrics"] and streamed["sentences"] == held["sentences"] == 40
    assert streamed["hypotheses"] == held["hypotheses"] and streamed["data"] == held["data"]


@pytest.mark.parametrize("per_sentence", ["false", "true"])
def test_eval_hyp_refuses_a_shorter_file_where_it_ends_in_one_line(tmp_path, monkeypatch, capsys, per_sentence):
    hyp, ref = tmp_path / "sys.en", tmp_path / "ref.en"
    hyp.write_text("a dog\na cat\n", encoding="utf-8")
    # Past line 3 the reference would fail to read (not UTF-8, over max_line_chars): it is never read there.
    ref.write_bytes(b"a dog\na cat\na man\n\xff\xfe\n" + b"x" * 300_000 + b"\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_status:
        run_cli(monkeypatch, "eval", f"hyp={hyp}", f"ref={ref}", f"per_sentence={per_sentence}")
    assert exit_status.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"mtrain: error: hyp={hyp} has 2 lines but ref={ref} has more; the files must be line-aligned "
        "(one sentence per line)"
    ]


def test_a_memory_error_is_one_line(tmp_path, monkeypatch, capsys):
    def out_of_memory(*args, **kwargs):
        raise MemoryError

    hyp, ref = tmp_path / "sys.en", tmp_path / "ref.en"
    hyp.write_text("a dog\n", encoding="utf-8")
    ref.write_text("a dog\n", encoding="utf-8")
    monkeypatch.setattr("mtrain.evaluate.metrics.score_stream", out_of_memory)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_status:
        run_cli(monkeypatch, "eval", f"hyp={hyp}", f"ref={ref}")
    assert exit_status.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith("mtrain: error: out of memory (MemoryError): ") and error.count("\n") == 1


def test_report_groups_the_seeds_of_each_arm_in_its_table_and_plots(tmp_path, monkeypatch, capsys):
    """Two arms of two seeds: report.md gains a table over seeds (mean ± sd [t interval], Welch's
    p; no bootstrap with bootstrap_samples=0), the plots draw one line and one min-max band per arm
    in the arm's colour, say so in their title, and come as SVG as well as PNG."""
    from matplotlib.colors import to_hex

    from mtrain.evaluate.arms import group_arms
    from mtrain.evaluate.curves import TRAIN_LOSS, curves_figure, read_scalars
    from mtrain.evaluate.runs import discover_runs

    sweep = tmp_path / "multirun" / "12-00-00"
    bleus = {"0": 20.0, "1": 21.0, "2": 25.0, "3": 26.5}
    for job, (arm, seed) in zip(bleus, [("pre", 1), ("pre", 2), ("post", 1), ("post", 2)], strict=True):
        offset = int(job) / 10
        make_fake_run(
            sweep / job,
            [f"model.norm_position={arm}", f"seed={seed}"],
            [(10, 6.0 + offset), (20, 5.0 + offset), (30, 4.0 + offset)],
            [(15, 10.0 + int(job)), (30, bleus[job] - 2)],
            {"test": {"bleu": bleus[job], "chrf": 40.0 + int(job)}, "updates": 30},
        )
    monkeypatch.chdir(tmp_path)
    run_cli(monkeypatch, "report", str(sweep), "bootstrap_samples=0")
    out_dir = sweep / "report"
    markdown = (out_dir / "report.md").read_text(encoding="utf-8")
    over_seeds = markdown.split("## Over seeds\n\n")[1].splitlines()
    assert over_seeds[0].startswith("| arm | differs | seeds | BLEU mean ± sd [95% CI] | Δ BLEU [95% CI] |")
    # sd of 20 and 21: 0.707; t(0.975, 1) = 12.706: half-width 12.706 * 0.707 / sqrt(2) = 6.35
    assert over_seeds[2].startswith("| 0 (baseline) | model.norm_position=pre | 1, 2 | 20.50 ± 0.71 [14.15, 26.85] | -")
    post = over_seeds[3].split(" | ")
    assert post[:5] == ["| 2", "model.norm_position=post", "1, 2", "25.75 ± 1.06 [16.22, 35.28]", "+5.25"]
    assert post[5] == "-" and 0 < float(post[6]) < 0.1  # no bootstrap asked for; Welch's p
    assert "Welch's t-test over the seeds' scores" in markdown and "Over seeds (2 arms)" in capsys.readouterr().out
    for plot in ("train_loss", "valid_bleu"):
        assert f"![{plot.replace('_', ' ')}]({plot}.png) ([SVG]({plot}.svg))" in markdown
        assert (out_dir / f"{plot}.png").read_bytes().startswith(PNG_MAGIC)
        svg = (out_dir / f"{plot}.svg").read_text(encoding="utf-8")
        assert "<svg" in svg and "mean over seeds, band min-max (2 arms, 4 runs)" in svg.replace("\n", " ")
        assert f"(…/{tmp_path.name}/multirun/12-00-00)" in svg and str(tmp_path) not in svg  # a readable title

    runs = discover_runs(str(sweep))
    curves = {run.name: read_scalars(run.path) for run in runs}
    figure = curves_figure(runs, curves, TRAIN_LOSS, [], "training loss", "loss", group_arms(runs))
    axes = figure.axes[0]
    lines, bands = axes.get_lines(), axes.collections
    assert [line.get_label().split(":")[0] for line in lines] == ["0", "2"]  # one line per arm
    assert list(lines[0].get_ydata()) == pytest.approx([6.05, 5.05, 4.05])  # the mean of its seeds
    assert "(mean of 2 seeds, band min-max)" in lines[1].get_label()
    assert len(bands) == 2 and [to_hex(band.get_facecolor()[0]) for band in bands] == [
        to_hex(line.get_color()) for line in lines
    ]
    low_high = bands[1].get_paths()[0].vertices[:, 1]
    # Seeds 2 and 3 (offsets 0.2, 0.3): the band runs from 4.2 (update 30) to 6.3 (update 10).
    assert min(low_high) == pytest.approx(4.2, abs=1e-5) and max(low_high) == pytest.approx(6.3, abs=1e-5)
