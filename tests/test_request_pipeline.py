"""One path from a request to the decoder (mtrain.decode.requests.pipeline): the same request through
`mtrain translate`, mtrain's JSON API and the LibreTranslate API gives the same text, and the
same refusal (mtrain.decoding_rules: one wording; the command line's one line and exit 2
before a model loads, HTTP 422 naming the field), control by control and for every
combination the rules forbid; the server glossary (`serve terms=`) through both APIs.

In-process and cheap: translate's stream on a file, the real app (with its batcher) behind
Starlette's test client, the command line's checks as `mtrain` runs them (`check_before_run`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf
from starlette.testclient import TestClient

from mtrain.config import DecodeConfig, ServeConfig, to_typed
from mtrain.decode.requests.controls import line_controls
from mtrain.decode.requests.pipeline import PipelineStats
from mtrain.decode.requests.request import DecodeRequest
from mtrain.decode.selection.selecting import describe_search
from mtrain.decode.text.stream import translate_stream
from mtrain.serve.app import build_app
from mtrain.serve.model import open_served_model
from tests.decoding_run import TINY_MODEL as MODEL  # the shared `model` fixture's (tests/conftest.py)
from tests.decoding_run import job

SENTENCES = ["Zwei junge Männer stehen vor einem Gebäude.", "Ein Hund.", "Eine Frau spielt Gitarre."]
MARKUP = ["Zwei <b>junge</b> Männer stehen vor einem Gebäude.", 'Ein <a href="x">Hund</a>.<br/>']
TERMS = [("Hund", "dog"), ("Gitarre", "guitar")]
SHORT = {"beam": 2, "max_len_a": 0.5, "max_len_b": 3}
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pipeline_files")
    paths = {
        "terms": root / "terms.tsv",
        "avoid": root / "avoid.txt",
        "prefix": root / "prefix.txt",
        "plain": root / "plain.de",
        "markup": root / "markup.de",
        "tabbed": root / "tabbed.de",
    }
    paths["terms"].write_text("".join(f"{s}\t{t}\n" for s, t in TERMS), encoding="utf-8")
    paths["avoid"].write_text("the\nA\n", encoding="utf-8")
    paths["prefix"].write_text("Two young\n\nThe woman\n", encoding="utf-8")
    paths["plain"].write_text("".join(s + "\n" for s in SENTENCES), encoding="utf-8")
    paths["markup"].write_text("".join(s + "\n" for s in MARKUP), encoding="utf-8")
    paths["tabbed"].write_text(f"{SENTENCES[0]}\tmen\n{SENTENCES[1]}\tdog\tbig\n{SENTENCES[2]}\n", encoding="utf-8")
    return paths


def decode_cfg(**values: Any) -> DecodeConfig:
    """A DecodeConfig of SHORT and `values` (nested sections as dicts)."""
    return to_typed(OmegaConf.merge(OmegaConf.structured(DecodeConfig), {**SHORT, **values}))


def serve_cfg(run: Path, **settings: Any) -> ServeConfig:
    decode = decode_cfg(**settings.pop("decode", {}))
    return ServeConfig(run=str(run), device="cpu", precision="fp32", decode=decode, **settings)


@pytest.fixture(scope="module")
def served(run_dir):
    return open_served_model(serve_cfg(run_dir), CPU, 1)


def client(served, run_dir, **settings: Any) -> TestClient:
    return TestClient(
        build_app(served, serve_cfg(run_dir, **settings)), raise_server_exceptions=False, base_url="http://localhost"
    )


def translate_lines(served, tmp_path: Path, **settings: Any) -> list[str]:
    """`mtrain translate`'s output lines for `settings` (its keys), from its stream (the
    command's body) on the served engine; constraints, terms and avoid read as it reads them."""
    decode = settings.pop("decode", {})
    settings = {key: str(value) if isinstance(value, Path) else value for key, value in settings.items()}
    controls = line_controls(settings.get("constraints", "none"), settings.get("terms"), False, settings.get("avoid"))
    out = tmp_path / "out.txt"
    cfg = job(output=str(out), decode={**SHORT, **decode}, **settings)
    translate_stream(served.engine, served.tokenizer, cfg, CPU, "fp32", controls)
    return out.read_text(encoding="utf-8").splitlines()


def libre(body: dict[str, Any]) -> dict[str, Any]:
    return {"source": "de", "target": "en", **body}


# ------------------------------------------------------------------ the same text, control by control
def test_each_control_gives_the_same_text_through_translate_and_both_apis(served, run_dir, files, tmp_path):
    terms_tsv = files["terms"].read_text(encoding="utf-8")
    prefixes = ["Two young", None, "The woman"]
    rows: list[tuple[str, dict[str, Any], dict[str, Any], dict[str, Any] | None]] = [
        # name, translate's settings (lines from `input`), the JSON body, LibreTranslate's (None: no such field)
        ("plain", {"input": files["plain"]}, {"text": SENTENCES}, {"q": SENTENCES}),
        ("greedy", {"input": files["plain"], "decode": {"beam": 1}}, {"text": SENTENCES, "beam": 1}, None),
        ("prefix", {"input": files["plain"], "prefix": files["prefix"]}, {"text": SENTENCES, "prefix": prefixes}, None),
        (
            "constraints",
            {"input": files["tabbed"], "constraints": "unordered"},
            {"text": SENTENCES, "constraints": [["men"], ["dog", "big"], []]},
            None,
        ),
        ("avoid", {"input": files["plain"], "avoid": files["avoid"]}, {"text": SENTENCES, "avoid": ["the", "A"]},
         {"q": SENTENCES, "avoid": "the\nA"}),
        ("terms", {"input": files["plain"], "terms": files["terms"]}, {"text": SENTENCES, "terms": [list(t) for t in TERMS]},
         {"q": SENTENCES, "terms": terms_tsv}),
        ("xml", {"input": files["markup"], "format": "xml"}, {"text": MARKUP, "format": "xml"}, None),
        ("html", {"input": files["markup"], "format": "html"}, {"text": MARKUP, "format": "html"},
         {"q": MARKUP, "format": "html"}),
        ("html_terms", {"input": files["markup"], "format": "html", "terms": files["terms"]},
         {"text": MARKUP, "format": "html", "terms": [list(t) for t in TERMS]},
         {"q": MARKUP, "format": "html", "terms": [list(t) for t in TERMS]}),
    ]  # fmt: skip
    with client(served, run_dir) as api:
        for name, cli, body, libre_body in rows:
            lines = translate_lines(served, tmp_path, **cli)
            answer = api.post("/translate", json=body)
            assert answer.status_code == 200, (name, answer.text)
            assert answer.json()["translations"] == lines, name
            if libre_body is not None:
                libre_answer = api.post("/translate", json=libre(libre_body))
                assert libre_answer.status_code == 200, (name, libre_answer.text)
                assert libre_answer.json()["translatedText"] == lines, name


def test_nbest_and_alignments_are_the_same_through_translate_and_both_apis(served, run_dir, files, tmp_path):
    with client(served, run_dir, max_beam=4) as api:
        rows = translate_lines(served, tmp_path, input=files["plain"], decode={"beam": 3, "nbest": 3})
        cli = [[row.split("\t")[2] for row in rows if row.startswith(f"{i}\t")] for i in range(len(SENTENCES))]
        body = api.post("/translate", json={"text": SENTENCES, "beam": 3, "nbest": 3}).json()
        assert [[entry["text"] for entry in hyps] for hyps in body["nbest"]] == cli
        alternatives = api.post("/translate", json=libre({"q": SENTENCES[0], "alternatives": 2})).json()
        assert [alternatives["translatedText"], *alternatives["alternatives"]] == list(dict.fromkeys(cli[0]))
        aligned = translate_lines(served, tmp_path, input=files["plain"], decode={"alignment": "true"})
        body = api.post("/translate", json={"text": SENTENCES, "alignment": True}).json()
        assert [f"{t}\t{a}" for t, a in zip(body["translations"], body["alignments"], strict=True)] == aligned


def test_the_server_glossary_applies_to_every_request_of_both_apis(served, run_dir, files, tmp_path):
    with_terms = translate_lines(served, tmp_path, input=files["plain"], terms=files["terms"])
    plain = translate_lines(served, tmp_path, input=files["plain"])
    assert with_terms != plain and "dog" in with_terms[1] and "guitar" in with_terms[2]
    with client(served, run_dir, terms=str(files["terms"])) as api:
        assert api.post("/translate", json={"text": SENTENCES}).json()["translations"] == with_terms
        assert api.post("/translate", json=libre({"q": SENTENCES})).json()["translatedText"] == with_terms
        # a request's own pair wins over the server's for its source term
        own = api.post("/translate", json={"text": SENTENCES[1:2], "terms": [["Hund", "puppy"]]}).json()
        assert "puppy" in own["translations"][0] and "dog" not in own["translations"][0].split()
        bad = api.post("/translate", json={"text": SENTENCES, "terms": [["Hund"]]})
        assert (bad.status_code, bad.json()["error"]) == (
            422,
            "terms[0]: must be a [source term, target term] pair of non-blank strings",
        )


# ------------------------------------------------------------------ the same refusal, rule by rule
MBR = {"mbr": {"candidates": "beam", "num_candidates": 2}}
RERANK = {"rerank": {"weights": "w.json"}}
REFUSALS: list[tuple[str, dict[str, Any], list[str], dict[str, Any] | None, dict[str, Any] | None, str]] = [
    # name, the server's decode, translate's arguments, JSON body, LibreTranslate body, the reason
    ("mbr+prefix", MBR, ["prefix={prefix}"], {"prefix": ["A", None, None]}, None, "SELECTION_WITH_CONTROLS"),
    ("mbr+constraints", MBR, ["constraints=unordered"], {"constraints": [["dog"], [], []]}, None, "SELECTION_WITH_CONTROLS"),
    ("mbr+avoid", MBR, ["avoid={avoid}"], {"avoid": ["the"]}, {"avoid": "the"}, "SELECTION_WITH_CONTROLS"),
    ("mbr+terms", MBR, ["terms={terms}"], {"terms": [["Hund", "dog"]]}, {"terms": "Hund\tdog"}, "SELECTION_WITH_CONTROLS"),
    ("rerank+terms", RERANK, ["terms={terms}"], {"terms": [["Hund", "dog"]]}, {"terms": "Hund\tdog"}, "SELECTION_WITH_CONTROLS"),
    ("rerank+prefix", RERANK, ["prefix={prefix}"], {"prefix": ["A", None, None]}, None, "SELECTION_WITH_CONTROLS"),
    ("mbr+html", MBR, ["format=html"], {"format": "html"}, {"format": "html"}, "SELECTION_WITH_ALIGNMENT"),
    ("mbr+alignment", MBR, ["decode.alignment=true"], {"alignment": True}, None, "SELECTION_WITH_ALIGNMENT"),
    ("sampling+terms", {"sampling": "topk"}, ["terms={terms}"], {"terms": [["Hund", "dog"]]}, {"terms": "Hund\tdog"},
     "CONSTRAINTS_WITH_SAMPLING"),
    ("sampling+constraints", {"sampling": "topk"}, ["constraints=ordered"], {"constraints": [["dog"], [], []]}, None,
     "CONSTRAINTS_WITH_SAMPLING"),
    ("subword+xml", {"alignment": "subword"}, ["format=xml"], {"format": "xml"}, None, "MARKUP_WITH_SUBWORD_LINKS"),
]  # fmt: skip
CTRANSLATE2: list[tuple[str, list[str], dict[str, Any], dict[str, Any] | None]] = [
    ("ct2+terms", ["terms={terms}"], {"terms": [["Hund", "dog"]]}, {"terms": "Hund\tdog"}),
    ("ct2+constraints", ["constraints=unordered"], {"constraints": [["dog"], [], []]}, None),
]


def cli_refusal(argv: list[str], capsys) -> str:
    from mtrain.cli.common import check_before_run

    with pytest.raises(SystemExit) as stop:
        check_before_run("translate", argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    (line,) = err.splitlines()
    return line


def decode_overrides(decode: dict[str, Any], prefix: str = "decode") -> list[str]:
    out = []
    for key, value in decode.items():
        out += decode_overrides(value, f"{prefix}.{key}") if isinstance(value, dict) else [f"{prefix}.{key}={value}"]
    return out


@pytest.mark.parametrize(
    ("name", "decode", "argv", "body", "libre_body", "reason"), REFUSALS, ids=[r[0] for r in REFUSALS]
)
def test_a_forbidden_combination_is_one_refusal_everywhere(
    served,
    run_dir,
    files,
    capsys,
    name,
    decode,
    argv,
    body,
    libre_body,
    reason,
):
    import mtrain.decoding_rules as rules

    words = getattr(rules, reason)
    given = [arg.format(**{k: str(v) for k, v in files.items()}) for arg in argv]
    line = cli_refusal([f"run={run_dir}", f"input={files['plain']}", *given, *decode_overrides(decode)], capsys)
    assert line.startswith("mtrain: error: ") and line.endswith(f": {words}"), line
    with client(served, run_dir, decode=decode) as api:
        answer = api.post("/translate", json={"text": SENTENCES, **body})
        field = next(iter(body))
        assert (answer.status_code, answer.json()["error"]) == (422, f"{field}: {words}"), name
        if libre_body is not None:
            answer = api.post("/translate", json=libre({"q": SENTENCES[0], **libre_body}))
            assert (answer.status_code, answer.json()["error"]) == (422, f"{next(iter(libre_body))}: {words}"), name


@pytest.mark.parametrize(("name", "argv", "body", "libre_body"), CTRANSLATE2, ids=[r[0] for r in CTRANSLATE2])
def test_what_ctranslate2_cannot_honour_is_one_refusal_everywhere(
    served,
    run_dir,
    files,
    capsys,
    name,
    argv,
    body,
    libre_body,
):
    from mtrain.decoding_rules import CONSTRAINTS_WITH_CTRANSLATE2
    from mtrain.serve.model import ServedModel

    given = [arg.format(**{k: str(v) for k, v in files.items()}) for arg in argv]
    line = cli_refusal([f"run={run_dir}", f"input={files['plain']}", "engine=ctranslate2", *given], capsys)
    assert line.endswith(f": {CONSTRAINTS_WITH_CTRANSLATE2}"), line
    as_ct2 = ServedModel(**{**vars(served), "engine_name": "ctranslate2", "decoder": None})
    with client(as_ct2, run_dir) as api:  # refused before anything decodes
        answer = api.post("/translate", json={"text": SENTENCES, **body})
        assert (answer.status_code, answer.json()["error"]) == (
            422,
            f"{next(iter(body))}: {CONSTRAINTS_WITH_CTRANSLATE2}",
        )
        if libre_body is not None:
            answer = api.post("/translate", json=libre({"q": SENTENCES[0], **libre_body}))
            assert answer.status_code == 422 and answer.json()["error"].endswith(CONSTRAINTS_WITH_CTRANSLATE2)


@pytest.mark.parametrize(
    ("mode", "refused"), [("annotation", True), ("both", True), ("auto", False), ("constraints", False)]
)
def test_terms_as_annotation_of_a_plain_model_is_one_refusal_everywhere(
    served, run_dir, files, capsys, tmp_path, mode, refused
):
    """decode.term_mode's rule (mtrain.decoding_rules.check_term_mode): the command line refuses
    it before the model loads (run='s config.yaml says it reads no terms), the request pipeline
    once it has loaded (translate's stream, as for an ensemble or an export), and both APIs with
    422, in one wording; a mode the model can honour passes everywhere."""
    from mtrain.config import FitConfig, ModelConfig
    from mtrain.decoding_rules import TERMS_IN_A_PLAIN_SOURCE, RefusedCombination

    plain = tmp_path / "plain_run"  # run_dir with the config.yaml `mtrain fit` writes beside its checkpoints
    plain.mkdir()
    for part in ("tokenizer", "checkpoints"):
        (plain / part).symlink_to(run_dir / part)
    (plain / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(FitConfig(model=ModelConfig(**MODEL)))))
    refusal = f"decode.term_mode={mode}: {TERMS_IN_A_PLAIN_SOURCE}"
    argv = [f"run={plain}", f"input={files['plain']}", f"terms={files['terms']}", f"decode.term_mode={mode}"]
    settings = {"input": files["plain"], "terms": files["terms"], "decode": {"term_mode": mode}}
    body = {"text": SENTENCES, "terms": [list(t) for t in TERMS]}
    libre_body = libre({"q": SENTENCES[0], "terms": files["terms"].read_text(encoding="utf-8")})
    with client(served, run_dir, decode={"term_mode": mode}) as api:
        if refused:
            assert cli_refusal(argv, capsys) == f"mtrain: error: {refusal}"
            with pytest.raises(RefusedCombination) as stream_refusal:
                translate_lines(served, tmp_path, **settings)
            assert str(stream_refusal.value) == refusal
            for answer in (api.post("/translate", json=body), api.post("/translate", json=libre_body)):
                assert (answer.status_code, answer.json()["error"]) == (422, refusal)
        else:
            from mtrain.cli.common import check_before_run

            check_before_run("translate", argv)
            assert len(translate_lines(served, tmp_path, **settings)) == len(SENTENCES)
            assert [api.post("/translate", json=b).status_code for b in (body, libre_body)] == [200, 200]


# The n-best rule (mtrain.decoding_rules.check_nbest): the command line and a request get one
# verdict in the same words, each naming the keys it was given by. (server decode, request fields)
NBEST: list[tuple[str, dict[str, Any], dict[str, Any], str | None]] = [
    (
        "above the beam",
        {},
        {"beam": 2, "nbest": 3},
        "3 is above {p}beam=2 (beam search keeps only `beam` hypotheses); raise {p}beam",
    ),
    ("within the beam", {}, {"beam": 2, "nbest": 2}, None),
    ("samples", {"sampling": "topk", "beam": 1}, {"nbest": 3}, None),
    (
        "above MBR's candidates",
        {"mbr": {"candidates": "beam", "num_candidates": 4}, "beam": 4, "nbest": 1},
        {"nbest": 5},
        "5 is above decode.mbr.num_candidates=4 (MBR ranks only its candidates); raise decode.mbr.num_candidates",
    ),
]


@pytest.mark.parametrize(("name", "decode", "fields", "words"), NBEST, ids=[r[0] for r in NBEST])
def test_nbest_beyond_what_the_decode_keeps_is_one_verdict_in_the_cli_and_the_api(
    served, run_dir, files, capsys, name, decode, fields, words
):
    from mtrain.cli.common import check_before_run
    from mtrain.serve.app import TranslateRequest, request_decoding
    from mtrain.serve.translation import Rejected

    argv = [f"run={run_dir}", f"input={files['plain']}", *decode_overrides({**decode, **fields})]
    cfg = serve_cfg(run_dir, decode=decode)
    request = TranslateRequest(text=SENTENCES[:1], **fields)
    if words is None:
        check_before_run("translate", argv)  # no SystemExit
        assert request_decoding(request, cfg).nbest == fields["nbest"]
        return
    assert cli_refusal(argv, capsys) == f"mtrain: error: decode.nbest: {words.format(p='decode.')}"
    with pytest.raises(Rejected) as refused:
        request_decoding(request, cfg)
    assert (refused.value.status, str(refused.value)) == (422, f"nbest: {words.format(p='')}"), name


# ------------------------------------------------------------------ what the start and end lines say
def test_the_start_line_names_the_selection_and_the_end_what_the_controls_did():
    assert describe_search(DecodeConfig()) == "beam 5"
    assert describe_search(DecodeConfig(beam=1)) == "greedy"
    mbr = decode_cfg(mbr={"candidates": "beam", "num_candidates": 16}, rerank={"weights": "w.json", "reverse_run": "r"})
    assert describe_search(mbr) == "MBR-chrF over 16 beam candidates, reranked by forward+reverse+length_ratio+mbr"
    assert describe_search(decode_cfg(sampling="topp", nbest=4)) == "top-p sampling (p=0.9), 4 samples"
    stats = PipelineStats()
    stats.count(DecodeRequest("Ein Hund.", "", ("dog", "big"), terms=("dog",)), "A big dog .")
    stats.count(DecodeRequest("Ein Ball.", "", ("ball",)), "A toy.")
    stats.count(DecodeRequest("Nichts."), "Nothing.")
    assert (
        stats.summary()
        == "constraints: 2 applied in 2 of 3 sentences, 1 met; terms: 1 found in 1 of 3 sentences, 1 met"
    )
