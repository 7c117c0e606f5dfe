"""`mtrain eval ... terms=FILE.tsv`: the terminology metrics (mtrain.evaluate.terminology) beside
BLEU, for a hypothesis file (with its sources) and for a run decoded with the glossary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtrain.decode.requests.terminology import read_glossary
from mtrain.evaluate.terminology import score_terms
from tests.warm_process import run_mtrain


@pytest.fixture
def scored_file(tmp_path) -> dict[str, Path]:
    files = {
        "src": "Der Hund bellt .\nEin Mann läuft .\nZwei Katzen .\n",
        "hyp": "The dog canine barks .\nA gentleman runs .\nTwo cats .\n",
        "ref": "The canine barks .\nA gentleman walks .\nTwo cats .\n",
        "terms": "# a synonym glossary\nHund\tcanine\tdog\nMann\tgentleman\tman|guy\n",
    }
    paths = {name: tmp_path / name for name in files}
    for name, text in files.items():
        paths[name].write_text(text, encoding="utf-8")
    return paths


def test_eval_hyp_with_a_glossary_prints_the_term_metrics_beside_bleu(scored_file):
    f = scored_file
    result = run_mtrain(
        "eval", f"hyp={f['hyp']}", f"ref={f['ref']}", f"src={f['src']}", f"terms={f['terms']}", text=True
    )
    assert result.returncode == 0, result.stderr
    lines = {line.split("  ")[0]: line.split() for line in result.stdout.splitlines()}
    assert "BLEU" in lines
    assert lines["exact-match term accuracy"][3:5] == ["100.00", "2"]  # both terms produced
    assert lines["usual translation kept beside"][4] == "50.00"  # "dog" stays beside "canine"
    assert lines["window overlap 2"][3] == "75.00"  # canine: 2/2 of its neighbours, gentleman: 1/2
    assert lines["1-TERm"][1] == "83.33"  # edit rates 1/4 (dog inserted), 1/4 (runs for walks), 0


def test_eval_hyp_terms_needs_the_sources_and_src_is_hyps(scored_file):
    f = scored_file
    without_sources = run_mtrain("eval", f"hyp={f['hyp']}", f"ref={f['ref']}", f"terms={f['terms']}", text=True)
    assert without_sources.returncode == 2
    assert f"terms={f['terms']}: finds its terms in the sources of hyp=" in without_sources.stderr
    assert "give them as src=FILE" in without_sources.stderr
    short = f["src"].with_name("short")
    short.write_text("Der Hund bellt .\n", encoding="utf-8")
    misaligned = run_mtrain(
        "eval", f"hyp={f['hyp']}", f"ref={f['ref']}", f"src={short}", f"terms={f['terms']}", text=True
    )
    assert misaligned.returncode == 2
    assert f"src={short} has 1 lines but hyp={f['hyp']} has 3" in misaligned.stderr
    bad = f["terms"].with_name("bad.tsv")
    bad.write_text("Hund canine\n", encoding="utf-8")
    malformed = run_mtrain("eval", f"hyp={f['hyp']}", f"ref={f['ref']}", f"src={f['src']}", f"terms={bad}", text=True)
    assert malformed.returncode == 2 and f"terms={bad} line 1: expected" in malformed.stderr
    assert "Traceback" not in malformed.stderr + misaligned.stderr + without_sources.stderr


def test_eval_run_decodes_with_the_glossary_and_reports_the_term_metrics(tiny_run, tmp_path):
    terms = tmp_path / "terms.tsv"
    terms.write_text("hund\tcanine\tdog\nkatze\tfeline\tcat\n", encoding="utf-8")
    out = tmp_path / "out"
    result = run_mtrain(
        "eval", f"run={tiny_run}", "split=test", "decode.beam=2", "device=cpu", f"terms={terms}", f"out={out}",
        text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads((out / "test.json").read_text(encoding="utf-8"))
    hyps = (out / "test.hyp").read_text(encoding="utf-8").splitlines()
    glossary = read_glossary(terms)
    expected = score_terms(glossary, report_file(report, "source"), hyps, report_file(report, "reference"))
    assert report["terms"]["glossary"] == str(terms) and report["terms"]["term_instances"] == expected.instances > 0
    assert report["terms"]["exact_match_accuracy"] == expected.exact_match == 1.0  # constraints: every term there
    assert report["terms"]["one_minus_term"] == expected.one_minus_term
    assert "exact-match term accuracy" in result.stdout and "100.00" in result.stdout
    markdown = (out / "test.md").read_text(encoding="utf-8")
    assert f"Terminology with the glossary `{terms}`" in markdown and "| 1-TERm |" in markdown


def report_file(report: dict, role: str) -> list[str]:
    path = next(record["path"] for record in report["data"] if record["role"] == role)
    return Path(path).read_text(encoding="utf-8").splitlines()
