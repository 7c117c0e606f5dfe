"""The confidence score where users read it: `mtrain translate`'s `confidence=true` column,
the JSON API's `confidences` and LibreTranslate's `translationConfidence`, each the number
`Confidence.of` gives the decoded hypothesis (mtrain.decode.translation.confidence), null for
a blank source or a line that is its prefix alone; the CTranslate2 export's the torch engine's."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from mtrain.checkpoint.files import save_checkpoint
from mtrain.config import DecodeConfig, FitConfig, ModelConfig, ServeConfig, TranslateConfig, to_plain
from mtrain.decode.text.stream import translate_stream
from mtrain.decode.translation.confidence import Calibration, Confidence, run_confidence, write_calibration
from mtrain.decode.translation.translator import translate_sentences
from mtrain.model import build_model
from mtrain.rundir import CONFIDENCE_FILE
from mtrain.tokenizer import Tokenizer

MODEL = dict(encoder_layers=1, decoder_layers=2, d_model=32, heads=4, ffn_dim=64, dropout=0.0, max_positions=64)
SENTENCES = [
    "Zwei junge Männer stehen vor einem Gebäude.",
    "Ein Hund.",
    "Eine Frau mit einem roten Hut spielt Gitarre auf der Straße, während Kinder zusehen.",
    "Ein Mann fährt Fahrrad.",
]
DECODE = {"beam": 2, "max_len_a": 0.5, "max_len_b": 3}
# A calibration whose knots straddle the tiny model's mean token log-probabilities (about -9):
# the scores differ from sentence to sentence and from the uncalibrated exp(signal).
CALIBRATION = Calibration((-15.0, -10.0, -8.0, -5.0, 0.0), (0.05, 0.2, 0.4, 0.6, 0.9), fitted_on="a test")
CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)  # tiny models: threads cost more than they save
    return


@pytest.fixture(scope="module")
def tokenizer(multi30k_spm_tokenizer) -> Tokenizer:
    return multi30k_spm_tokenizer


@pytest.fixture(scope="module")
def model(tokenizer):
    torch.manual_seed(0)
    return build_model(
        ModelConfig(**MODEL),
        tokenizer.src_vocab_size,
        tokenizer.tgt_vocab_size,
        tokenizer.pad_id,
        joint_vocab=tokenizer.joint,
    ).eval()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tokenizer, model) -> Path:
    """A run directory as `mtrain fit` leaves it (de -> en), its confidence.json included."""
    directory = tmp_path_factory.mktemp("run")
    tokenizer.save(directory / "tokenizer")
    config = OmegaConf.structured(FitConfig(model=ModelConfig(**MODEL)))
    (directory / "config.yaml").write_text(OmegaConf.to_yaml(config), encoding="utf-8")
    save_checkpoint(
        directory / "checkpoints" / "best.pt", {"model": model.state_dict(), "config": to_plain(config), "update": 7}
    )
    write_calibration(directory / CONFIDENCE_FILE, CALIBRATION)
    return directory


def job(**overrides) -> TranslateConfig:
    decode = overrides.pop("decode", {})
    cfg = OmegaConf.structured(TranslateConfig)
    cfg.decode = OmegaConf.merge(cfg.decode, {**DECODE, **decode})
    return OmegaConf.merge(cfg, overrides)


def translated_rows(model, tokenizer, tmp_path: Path, lines: list[str], **overrides) -> list[list[str]]:
    source = tmp_path / "in.de"
    source.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    output = tmp_path / "out.tsv"
    translate_stream(model, tokenizer, job(input=str(source), output=str(output), **overrides), CPU, "fp32")
    return [line.split("\t") for line in output.read_text(encoding="utf-8").split("\n")[:-1]]


# ------------------------------------------------------------------ mtrain translate
def test_translate_writes_each_line_s_confidence_after_its_translation(model, tokenizer, run_dir, tmp_path, caplog):
    lines = [SENTENCES[0], "", SENTENCES[1], "", SENTENCES[2]]
    prefix = tmp_path / "prefix.txt"
    prefix.write_text("\n\n\nA dog\n\n", encoding="utf-8")  # line 4: blank, its prefix alone
    with caplog.at_level(logging.INFO, logger="mtrain.translate"):
        rows = translated_rows(model, tokenizer, tmp_path, lines, run=str(run_dir), confidence=True, prefix=str(prefix))
    assert "confidence scores: calibrated on a test" in caplog.text
    assert all(len(row) == 2 for row in rows)  # one column more on every line, blank ones too
    assert rows[1] == ["", ""] and rows[3] == ["A dog", ""]  # null: nothing was decoded
    plain = translated_rows(model, tokenizer, tmp_path, lines, run=str(run_dir), prefix=str(prefix))
    assert [row[0] for row in rows] == [row[0] for row in plain]  # the translations as without the column
    assert all(len(row) == 1 for row in plain)
    conf = run_confidence(run_dir)
    decoded = translate_sentences(model, tokenizer, [lines[0], lines[2], lines[4]], DecodeConfig(**DECODE), "cpu")
    expected = [conf.of(hyps[0]) for hyps in decoded]
    scores = [float(rows[i][1]) for i in (0, 2, 4)]
    assert scores == pytest.approx(expected, abs=5e-5)
    assert all(0.0 <= score <= 1.0 for score in scores)
    assert len(set(scores)) > 1  # the sentences' scores differ: the column is per line
    uncalibrated = [Confidence().of(hyps[0]) for hyps in decoded]
    assert scores != pytest.approx(uncalibrated, abs=1e-3)  # the run's calibration was applied


def test_nbest_rows_and_alignments_keep_their_columns_around_the_confidence(model, tokenizer, run_dir, tmp_path):
    rows = translated_rows(
        model,
        tokenizer,
        tmp_path,
        [SENTENCES[1], ""],
        run=str(run_dir),
        confidence=True,
        decode={"beam": 3, "nbest": 2, "alignment": "word"},
    )
    # index, score, text, confidence, links; the blank line's one hypothesis: an empty confidence
    assert [len(row) for row in rows] == [5, 5, 5]
    assert [row[0] for row in rows] == ["0", "0", "1"]
    assert rows[2][3] == ""
    conf = run_confidence(run_dir)
    decoded = translate_sentences(
        model, tokenizer, [SENTENCES[1]], DecodeConfig(**{**DECODE, "beam": 3, "nbest": 2}), "cpu"
    )[0]
    assert [row[2] for row in rows[:2]] == [hyp.text for hyp in decoded]
    assert [float(row[3]) for row in rows[:2]] == pytest.approx([conf.of(hyp) for hyp in decoded], abs=5e-5)


def test_a_run_without_a_calibration_is_scored_uncalibrated(model, tokenizer, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="mtrain.translate"):
        rows = translated_rows(model, tokenizer, tmp_path, [SENTENCES[3]], run=str(tmp_path), confidence=True)
    assert "confidence scores: uncalibrated" in caplog.text
    decoded = translate_sentences(model, tokenizer, [SENTENCES[3]], DecodeConfig(**DECODE), "cpu")[0]
    assert float(rows[0][1]) == pytest.approx(Confidence().of(decoded[0]), abs=5e-5)


# ------------------------------------------------------------------ both HTTP APIs
@pytest.fixture(scope="module")
def client(run_dir):
    from starlette.testclient import TestClient

    from mtrain.serve.app import build_app
    from mtrain.serve.model import open_served_model

    cfg = ServeConfig(
        run=str(run_dir),
        device="cpu",
        precision="fp32",
        num_threads=1,
        decode=DecodeConfig(**DECODE),
        max_beam=4,
        access_log=False,
    )
    served = open_served_model(cfg, CPU, 1)
    with TestClient(build_app(served, cfg), base_url="http://localhost") as started:
        yield started


def test_the_json_api_and_libretranslate_give_the_same_confidence_as_translate(
    client, model, tokenizer, run_dir, tmp_path
):
    texts = [SENTENCES[0], "", SENTENCES[2]]
    mine = client.post("/translate", json={"text": texts, "confidence": True}).json()
    assert mine["confidences"][1] is None
    conf = run_confidence(run_dir)
    decoded = translate_sentences(model, tokenizer, [texts[0], texts[2]], DecodeConfig(**DECODE), "cpu")
    assert [mine["confidences"][0], mine["confidences"][2]] == pytest.approx(
        [conf.of(hyps[0]) for hyps in decoded], abs=1e-9
    )
    libre = client.post("/translate", json={"q": texts, "source": "de", "target": "en", "confidence": True}).json()
    assert libre["translatedText"] == mine["translations"]
    assert libre["translationConfidence"] == mine["confidences"]  # the very same numbers
    form = client.post("/translate", data={"q": texts[0], "source": "de", "target": "en", "confidence": "true"}).json()
    assert form["translationConfidence"] == mine["confidences"][0]
    rows = translated_rows(model, tokenizer, tmp_path, texts, run=str(run_dir), confidence=True)
    assert [float(rows[i][1]) for i in (0, 2)] == pytest.approx(
        [mine["confidences"][0], mine["confidences"][2]], abs=5e-5
    )


def test_the_apis_answer_as_before_unless_asked(client):
    mine = client.post("/translate", json={"text": [SENTENCES[1]]}).json()
    assert set(mine) == {"translations", "scores"}
    libre = client.post("/translate", json={"q": SENTENCES[1], "source": "de", "target": "en"}).json()
    assert set(libre) == {"translatedText"}
    refused = client.post("/translate", json={"q": "x", "source": "de", "target": "en", "confidence": "maybe"})
    assert refused.status_code == 400 and "confidence" in refused.json()["error"]
    wrong = client.post("/translate", json={"text": ["x"], "confidence": "yes"})
    assert wrong.status_code == 422 and wrong.json()["error"].startswith("confidence: must be true or false")


def test_nbest_hypotheses_and_a_text_of_several_lines_get_their_own_scores(client, model, tokenizer, run_dir):
    conf = run_confidence(run_dir)
    mine = client.post("/translate", json={"text": [SENTENCES[1]], "nbest": 2, "confidence": True}).json()
    decoded = translate_sentences(model, tokenizer, [SENTENCES[1]], DecodeConfig(**{**DECODE, "nbest": 2}), "cpu")[0]
    assert [hyp["confidence"] for hyp in mine["nbest"][0]] == pytest.approx([conf.of(h) for h in decoded], abs=1e-9)
    assert mine["confidences"] == [mine["nbest"][0][0]["confidence"]]
    # LibreTranslate: one text, two lines: its lines' scores weighted by their tokens (EOS counted)
    libre = client.post(
        "/translate", json={"q": f"{SENTENCES[0]}\n{SENTENCES[3]}", "source": "de", "target": "en", "confidence": True}
    ).json()
    best = [
        hyps[0]
        for hyps in translate_sentences(model, tokenizer, [SENTENCES[0], SENTENCES[3]], DecodeConfig(**DECODE), "cpu")
    ]
    weights = [len(hyp.tokens) + 1 for hyp in best]
    expected = sum(w * conf.of(hyp) for w, hyp in zip(weights, best, strict=True)) / sum(weights)
    assert libre["translationConfidence"] == pytest.approx(expected, abs=1e-9)
    blank = client.post(
        "/translate", json={"q": ["\n", "x"], "source": "de", "target": "en", "confidence": True}
    ).json()
    assert blank["translationConfidence"][0] is None


# ------------------------------------------------------------------ CTranslate2
def test_the_ctranslate2_export_scores_as_the_torch_engine_at_fp32(model, tokenizer, run_dir, tmp_path, caplog):
    pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed (pip install 'mtrain[ct2]')")
    from mtrain.decode.engines.ct2_engine import load_ctranslate2
    from mtrain.export import export_run

    exported = export_run(run_dir, tmp_path / "ct2")
    assert not (exported / CONFIDENCE_FILE).exists()
    engine = load_ctranslate2(exported, CPU, num_threads=1)
    lines = [*SENTENCES, ""]
    settings = {"decode": {"beam": 1}}
    with caplog.at_level(logging.INFO, logger="mtrain.translate"):
        ct2 = translated_rows(engine, tokenizer, tmp_path, lines, run=str(exported), confidence=True, **settings)
    assert "confidence scores: uncalibrated" in caplog.text  # an export without confidence.json
    torch_rows = translated_rows(model, tokenizer, tmp_path, lines, confidence=True, **settings)
    assert [row[0] for row in ct2] == [row[0] for row in torch_rows]
    assert ct2[-1][1] == torch_rows[-1][1] == ""
    assert [float(row[1]) for row in ct2[:-1]] == pytest.approx([float(row[1]) for row in torch_rows[:-1]], abs=2e-4)
