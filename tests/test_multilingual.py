"""Multilingual runs (data.lang_tags): the target-language tag reaches the encoder and never the
output, in every engine; translate's tgt_lang, eval's src_lang/tgt_lang (zero-shot directions
too), serve's per-request tgt_lang; validation per direction with best.pt on the mean; the
test decode per direction.

One tiny random model over a real joint SentencePiece model of Multi30k de/en/fr with the tags
as user-defined symbols (as preparation trains it), and a run directory as `mtrain fit` leaves
a four-direction run: what the tags do does not need a trained model, only a decoder that
would emit one if it could (the logits are forced where that matters).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import sentencepiece as spm
import torch
from omegaconf import OmegaConf

from mtrain.batches import EncodedCorpus
from mtrain.batches.prepare import DirectionData, PreparedData
from mtrain.checkpoint.files import save_checkpoint
from mtrain.config import (
    CorpusConfig,
    DecodeConfig,
    EvalConfig,
    FitConfig,
    ModelConfig,
    Precision,
    Sampling,
    ServeConfig,
    TranslateConfig,
    to_plain,
)
from mtrain.data.sources import ParallelText
from mtrain.decode.engines.directions import RunLanguages
from mtrain.decode.translation.translator import translate_sentences
from mtrain.errors import MtrainError
from mtrain.model import build_model
from mtrain.rundir import RunDir
from mtrain.tokenizer import Tokenizer
from tests.conftest import write_head

TAGS = ["<2de>", "<2en>", "<2fr>"]
DIRECTIONS = [("de", "en"), ("en", "de"), ("fr", "en"), ("en", "fr")]  # the preset's four
SPLITS = {"train": 300, "val": 6, "test_2016_flickr": 5}
MODEL = dict(encoder_layers=1, decoder_layers=1, d_model=32, heads=2, ffn_dim=64, dropout=0.0, max_positions=128)
DECODE = dict(beam=2, max_len_a=0.0, max_len_b=6)
SENTENCES = ["Ein Hund läuft.", "Zwei Männer stehen vor einem Gebäude.", "", "Un chien court."]
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny models


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, data_dir) -> Path:
    """The first lines of Multi30k's splits in German, English and French (line-aligned)."""
    out = tmp_path_factory.mktemp("m30k_de_en_fr")
    for split, count in SPLITS.items():
        for lang in ("de", "en", "fr"):
            write_head(data_dir / "multi30k" / f"{split}.{lang}.gz", out / f"{split}.{lang}", count)
    return out


@pytest.fixture(scope="module")
def tokenizer(corpus, tmp_path_factory) -> Tokenizer:
    """A joint 400-piece model of the three languages, the tags reserved as single pieces."""
    directory = tmp_path_factory.mktemp("spm")
    text = "".join((corpus / f"train.{lang}").read_text(encoding="utf-8") for lang in ("de", "en", "fr"))
    (directory / "train.txt").write_text(text, encoding="utf-8")
    with open(os.devnull, "w") as quiet:
        spm.SentencePieceTrainer.train(
            input=str(directory / "train.txt"),
            model_prefix=str(directory / "spm"),
            vocab_size=400,
            unk_id=0,
            pad_id=1,
            bos_id=2,
            eos_id=3,
            user_defined_symbols=TAGS,
            logstream=quiet,
        )
    return Tokenizer({"spm.model": directory / "spm.model"})


def multilingual_config(corpus: Path, directions=DIRECTIONS, lang_tags: bool = True):
    cfg = OmegaConf.structured(FitConfig(model=ModelConfig(**MODEL)))
    cfg.data.local_dir = str(corpus)
    cfg.data.lang_tags = lang_tags
    cfg.data.src, cfg.data.tgt = directions[0]
    cfg.data.corpora = [CorpusConfig(name="multi30k", src=src, tgt=tgt) for src, tgt in directions]
    cfg.decode = OmegaConf.merge(cfg.decode, DECODE)
    return cfg


@pytest.fixture(scope="module")
def model_shape() -> dict:
    """The shared `model` fixture (tests/conftest.py) at this module's size, over its tokenizer."""
    return MODEL


@pytest.fixture(scope="module")
def fit_config(corpus):
    return multilingual_config(corpus)


@pytest.fixture(scope="module")
def languages(fit_config) -> RunLanguages:
    return RunLanguages.of(fit_config.data)


def write_run(directory: Path, cfg, tokenizer: Tokenizer, model, directions) -> Path:
    """A run directory as `mtrain fit` leaves it: config, tokenizer, best.pt and each direction's text."""
    tokenizer.save(directory / "tokenizer")
    (directory / "config.yaml").write_text(OmegaConf.to_yaml(cfg), encoding="utf-8")
    save_checkpoint(
        directory / "checkpoints" / "best.pt", {"model": model.state_dict(), "config": to_plain(cfg), "update": 3}
    )
    corpus = Path(cfg.data.local_dir)
    run = RunDir(directory)
    for split, name in (("valid", "val"), ("test", "test_2016_flickr")):
        for src, tgt in directions:
            src_path, ref_path = run.split_files(split, f"{src}-{tgt}" if len(directions) > 1 else None)
            src_path.parent.mkdir(parents=True, exist_ok=True)
            src_path.write_text((corpus / f"{name}.{src}").read_text(encoding="utf-8"), encoding="utf-8")
            ref_path.write_text((corpus / f"{name}.{tgt}").read_text(encoding="utf-8"), encoding="utf-8")
    return directory


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, fit_config, tokenizer, model) -> Path:
    return write_run(tmp_path_factory.mktemp("multilingual_run"), fit_config, tokenizer, model, DIRECTIONS)


@pytest.fixture(scope="module")
def bilingual_run(tmp_path_factory, corpus, tokenizer, model) -> Path:
    """A de->en run without tags that shares the tokenizer (a fine-tune of the multilingual one)."""
    cfg = OmegaConf.structured(FitConfig(model=ModelConfig(**MODEL)))
    cfg.data.local_dir = str(corpus)
    return write_run(tmp_path_factory.mktemp("bilingual_run"), cfg, tokenizer, model, [("de", "en")])


def decode_cfg(**values) -> DecodeConfig:
    return DecodeConfig(**{**DECODE, **values})


def texts(nbest) -> list:
    return [hyps[0].text for hyps in nbest]


class EncoderInputs:
    """Records the source tokens every `encode` of the model class receives."""

    def __init__(self, monkeypatch) -> None:
        from mtrain.model.transformer import Seq2SeqTransformer

        self.batches: list = []
        original = Seq2SeqTransformer.encode

        def encode(model, src_tokens, src_padding_mask):
            self.batches.append(src_tokens.clone())
            return original(model, src_tokens, src_padding_mask)

        monkeypatch.setattr(Seq2SeqTransformer, "encode", encode)

    def first_tokens(self) -> set:
        return {int(token) for batch in self.batches for token in batch[:, 0]}


# ------------------------------------------------------------------ tags and languages
def test_a_direction_s_tokenizer_starts_every_source_with_its_tag(tokenizer, languages):
    into_french = languages.tokenizer_for(tokenizer, "fr")
    tag_ids = sorted(tokenizer.symbol_id(tag) for tag in TAGS)
    assert len(set(tag_ids)) == 3 and tokenizer.unk_id not in tag_ids
    assert into_french.encode_src("Ein Hund.") == [tokenizer.symbol_id("<2fr>")] + tokenizer.encode_src("Ein Hund.")
    assert sorted(into_french.tag_ids) == tag_ids  # every tag banned, not only the direction's own
    assert into_french.fingerprint == tokenizer.fingerprint  # the same vocabulary (ensembles, caches)
    assert tokenizer.source_prefix == () and tokenizer.tag_ids == ()  # the original is untouched
    untagged = RunLanguages.of({"src": "de", "tgt": "en"}).tokenizer_for(tokenizer, "en")
    assert untagged.encode_src("Ein Hund.") == tokenizer.encode_src("Ein Hund.") and untagged.tag_ids == ()
    with pytest.raises(MtrainError, match=r"tokenizer: '<2it>' is not a piece of .*spm.model"):
        tokenizer.symbol_id("<2it>")


def test_the_languages_a_run_translates_into(languages):
    assert languages.target_languages() == ["en", "de", "fr"]
    assert languages.target("fr") == "fr"
    with pytest.raises(
        MtrainError,
        match=r"^tgt_lang: this run translates into en, de, fr \(data.lang_tags\); "
        r"choose one, e.g. tgt_lang=en$",
    ):
        languages.target(None)
    with pytest.raises(
        MtrainError,
        match=r"^tgt_lang=it: this run does not translate into 'it'; choose one of: "
        r"en, de, fr$",
    ):
        languages.target("it")
    bilingual = RunLanguages.of({"src": "de", "tgt": "en"})
    assert bilingual.target(None) == bilingual.target("en") == "en"
    with pytest.raises(
        MtrainError,
        match=r"tgt_lang=fr: this run does not translate into 'fr' \(it has no "
        r"language tags: data.lang_tags=false\); choose one of: en$",
    ):
        bilingual.target("fr")


def test_an_untagged_run_of_several_target_languages_says_what_it_can_do():
    # en<->de without tags: the input's language decides; the message does not claim tags
    both_ways = RunLanguages.of({"src": "de", "tgt": "en", "corpora": [{"src": "de"}, {"src": "en", "tgt": "de"}]})
    assert both_ways.target("de") == "de"
    with pytest.raises(MtrainError, match=r"^tgt_lang: this run translates into en, de \(each from its own source"):
        both_ways.target(None)
    # de->en and de->fr without tags (trained before `mtrain fit` refused it): no tgt_lang can choose
    one_into_two = RunLanguages.of({"src": "de", "tgt": "en", "corpora": [{}, {"tgt": "fr"}]})
    for requested in (None, "en", "fr"):
        with pytest.raises(
            MtrainError, match=r"^tgt_lang: this run translates de into en and fr without language tags"
        ):
            one_into_two.target(requested)


def test_the_direction_eval_scores(languages):
    assert languages.direction("de", "en") == ("de", "en")
    assert languages.direction("de", "fr") == ("de", "fr")  # zero-shot: never trained
    assert languages.direction(None, "de") == ("en", "de")  # the one source trained into German
    assert languages.direction("fr", None) == ("fr", "en")
    for src, tgt, error in (
        (
            None,
            None,
            r"tgt_lang: this run trained de->en, en->de, fr->en, en->fr; name the "
            r"direction to score, e.g. src_lang=de tgt_lang=en",
        ),
        (None, "en", r"src_lang: this run trained .*; name the source language"),
        ("en", None, r"tgt_lang: this run trained"),
        ("de", "de", r"src_lang=de tgt_lang=de: the same language"),
        ("de", "it", r"tgt_lang=it: this run does not translate into 'it'"),
    ):
        with pytest.raises(MtrainError, match=error):
            languages.direction(src, tgt)
    bilingual = RunLanguages.of({"src": "de", "tgt": "en"})
    assert bilingual.direction(None, None) == ("de", "en")
    with pytest.raises(
        MtrainError,
        match=r"src_lang=fr tgt_lang=en: this run trained de->en without language "
        r"tags",
    ):
        bilingual.direction("fr", "en")


# ------------------------------------------------------------------ tags reach the encoder, never the output
def force_tags(model, tokenizer: Tokenizer, word: str = "▁Hund"):
    """A copy of `model` whose decoder would emit a tag at every step (logit 10) if it could,
    `word` next (5), eos after (4): every final decoder state is the same vector e (its
    norm's weight 0, bias e), and the output rows of the tags, the word and eos are multiples of e."""
    forced = build_model(
        ModelConfig(**MODEL),
        tokenizer.src_vocab_size,
        tokenizer.tgt_vocab_size,
        tokenizer.pad_id,
        joint_vocab=tokenizer.joint,
    ).eval()
    forced.load_state_dict(model.state_dict())
    e = torch.zeros(MODEL["d_model"])
    e[0] = 1.0
    with torch.no_grad():
        forced.decoder_norm.weight.zero_()
        forced.decoder_norm.bias.copy_(e)
        rows = forced.output_proj.weight
        rows[:, 0] = 0.0  # every other row scores 0
        for tag in TAGS:
            rows[tokenizer.symbol_id(tag)] = 10 * e
        rows[tokenizer.symbol_id(word)] = 5 * e
        rows[tokenizer.eos_id] = 4 * e
    return forced


@pytest.mark.parametrize(
    "settings",
    [dict(beam=1), dict(beam=3, nbest=3), dict(sampling=Sampling.topk, top_k=5, nbest=2)],
    ids=["greedy", "beam", "sampling"],
)
def test_tags_reach_the_encoder_and_never_the_output(settings, model, tokenizer, languages, monkeypatch):
    forced = force_tags(model, tokenizer)
    seen = EncoderInputs(monkeypatch)
    into_french = languages.tokenizer_for(tokenizer, "fr")
    nbest = translate_sentences(forced, into_french, SENTENCES, decode_cfg(**settings), "cpu")
    assert seen.first_tokens() == {tokenizer.symbol_id("<2fr>")}  # every source, and only that tag
    tag_ids = {tokenizer.symbol_id(tag) for tag in TAGS}
    outputs = [hyp for hyps, source in zip(nbest, SENTENCES, strict=True) if source for hyp in hyps]
    assert outputs and all(not tag_ids & set(hyp.tokens) for hyp in outputs)
    if settings == dict(beam=1):  # greedy repeats the next best word to the length limit
        assert outputs[0].text == "Hund Hund Hund Hund Hund Hund"
    # The teeth of the test: a tokenizer that bans nothing lets the forced tag out.
    unbanned = translate_sentences(forced, tokenizer, SENTENCES[:1], decode_cfg(**settings), "cpu")
    assert "<2" in unbanned[0][0].text


# ------------------------------------------------------------------ translate
def translate_file(run: Path, tmp_path: Path, **options) -> list:
    from mtrain.cli.translate import run_translate

    source, output = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("".join(line + "\n" for line in SENTENCES), encoding="utf-8")
    run_translate(
        TranslateConfig(
            run=str(run),
            input=str(source),
            output=str(output),
            decode=decode_cfg(),
            device="cpu",
            precision="fp32",
            num_threads=1,
            **options,
        )
    )
    return output.read_text(encoding="utf-8").splitlines()


def test_translate_tgt_lang_prefixes_the_target_language_s_tag(
    run_dir, model, tokenizer, languages, tmp_path, monkeypatch
):
    seen = EncoderInputs(monkeypatch)
    into_german = translate_file(run_dir, tmp_path, tgt_lang="de")
    assert seen.first_tokens() == {tokenizer.symbol_id("<2de>")}
    assert into_german == texts(
        translate_sentences(model, languages.tokenizer_for(tokenizer, "de"), SENTENCES, decode_cfg(), "cpu")
    )
    # An ensemble shares the tags: run= twice averages to the same model.
    assert translate_file(run_dir, tmp_path, tgt_lang="de", ensemble=[str(run_dir)]) == into_german


def test_translate_refuses_a_missing_or_unknown_tgt_lang(run_dir, bilingual_run, tmp_path, model, tokenizer):
    with pytest.raises(MtrainError, match=r"^tgt_lang: this run translates into en, de, fr"):
        translate_file(run_dir, tmp_path)
    with pytest.raises(
        MtrainError,
        match=r"^tgt_lang=it: this run does not translate into 'it'; choose one of: "
        r"en, de, fr$",
    ):
        translate_file(run_dir, tmp_path, tgt_lang="it")
    with pytest.raises(MtrainError, match=r"^tgt_lang=fr: this run does not translate into 'fr' \(it has no "):
        translate_file(bilingual_run, tmp_path, tgt_lang="fr")
    # a bilingual run's own target language is allowed, and changes nothing
    assert translate_file(bilingual_run, tmp_path, tgt_lang="en") == translate_file(bilingual_run, tmp_path)
    assert translate_file(bilingual_run, tmp_path) == texts(
        translate_sentences(model, tokenizer, SENTENCES, decode_cfg(), "cpu")
    )
    with pytest.raises(
        MtrainError,
        match=r"^ensemble: .*best.pt was trained with the tags none "
        r"\(data.lang_tags=False\), run=.* with \['<2de>', '<2en>', '<2fr>'\]",
    ):
        translate_file(run_dir, tmp_path, tgt_lang="de", ensemble=[str(bilingual_run)])


# ------------------------------------------------------------------ eval
def test_eval_finds_the_references_of_a_trained_and_of_a_zero_shot_direction(run_dir, corpus, fit_config):
    from mtrain.evaluate.references import read_run_split

    run = RunDir(run_dir)
    kept = run.split_files("test", "de-en")
    trained = read_run_split(run, fit_config.data, "test", ("de", "en"))
    assert [record["path"] for record in trained.files] == [str(path.resolve()) for path in kept]
    zero_shot = read_run_split(run, fit_config.data, "test", ("de", "fr"))  # never trained: the corpus' own files
    assert [record["path"] for record in zero_shot.files] == [
        str((corpus / f"test_2016_flickr.{lang}").resolve()) for lang in ("de", "fr")
    ]
    assert zero_shot.sources == trained.sources
    assert zero_shot.references[0] == (corpus / "test_2016_flickr.fr").read_text(encoding="utf-8").splitlines()


def test_eval_scores_a_zero_shot_direction_into_its_own_report(run_dir, model, tokenizer, languages, tmp_path):
    from mtrain.cli.evaluate import evaluate_run

    cfg = EvalConfig(
        run=str(run_dir),
        src_lang="de",
        tgt_lang="fr",
        decode=decode_cfg(),
        device="cpu",
        precision="fp32",
        num_threads=1,
        out=str(tmp_path),
        metrics=["bleu"],
    )
    report = evaluate_run(cfg, log=lambda *_: None)
    assert report["language_pair"] == "de-fr" and report["sentences"] == SPLITS["test_2016_flickr"]
    assert json.loads((tmp_path / "test.de-fr.json").read_text(encoding="utf-8"))["language_pair"] == "de-fr"
    sources = (Path(run_dir) / "data" / "test.de-en.src").read_text(encoding="utf-8").splitlines()
    expected = texts(translate_sentences(model, languages.tokenizer_for(tokenizer, "fr"), sources, decode_cfg(), "cpu"))
    assert (tmp_path / "test.de-fr.hyp").read_text(encoding="utf-8").splitlines() == expected
    with pytest.raises(MtrainError, match=r"^tgt_lang: this run trained de->en, en->de, fr->en, en->fr"):
        evaluate_run(EvalConfig(run=str(run_dir), out=str(tmp_path)), log=lambda *_: None)


# ------------------------------------------------------------------ serve
def test_serve_translates_into_the_language_each_request_names(run_dir, model, tokenizer, languages):
    from starlette.testclient import TestClient

    from mtrain.serve.app import build_app
    from mtrain.serve.model import open_served_model

    served = open_served_model(
        ServeConfig(run=str(run_dir), device="cpu", precision="fp32", decode=decode_cfg()),
        torch.device("cpu"),
        threads=1,
    )
    assert served.target_languages() == ["en", "de", "fr"] and (served.src_lang, served.tgt_lang) == (None, None)
    with TestClient(build_app(served, ServeConfig(decode=decode_cfg())), base_url="http://localhost") as client:
        for tgt in ("fr", "de"):
            response = client.post("/translate", json={"text": SENTENCES, "tgt_lang": tgt})
            assert response.status_code == 200, response.text
            assert response.json()["translations"] == texts(
                translate_sentences(model, languages.tokenizer_for(tokenizer, tgt), SENTENCES, decode_cfg(), "cpu")
            )
        response = client.post("/translate", json={"text": SENTENCES})
        assert (response.status_code, response.json()) == (
            422,
            {"error": "tgt_lang: null, but this model translates into 'en', 'de', 'fr'; name one"},
        )
        response = client.post("/translate", json={"text": SENTENCES, "tgt_lang": "it"})
        assert (response.status_code, response.json()) == (
            422,
            {"error": "tgt_lang: 'it' is not a language this model translates into (allowed: 'en', 'de', 'fr')"},
        )
        assert client.get("/health").json()["target_languages"] == ["en", "de", "fr"]


# ------------------------------------------------------------------ CTranslate2
def test_the_ctranslate2_export_gets_the_tag_pieces_and_decodes_as_torch(
    run_dir, model, tokenizer, languages, tmp_path
):
    pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed: the CTranslate2 export is optional")
    from mtrain.decode.engines.ct2_engine import load_ctranslate2
    from mtrain.decode.translation.translator import translate_encoded
    from mtrain.export import export_ctranslate2, export_run

    exported = load_ctranslate2(export_run(run_dir, tmp_path / "ct2"), torch.device("cpu"), "fp32", 1)
    assert exported.languages.target_languages() == ["en", "de", "fr"]
    assert sorted(exported.tokenizer.tag_ids) == sorted(tokenizer.symbol_id(tag) for tag in TAGS)
    pieces_seen = []
    translator = exported.translator

    class Recording:  # the CTranslate2 translator, its sources recorded
        def translate_batch(self, sources, **options):
            pieces_seen.extend(sources)
            return translator.translate_batch(sources, **options)

        def __getattr__(self, name):
            return getattr(translator, name)

    exported.translator = Recording()
    into_french = languages.tokenizer_for(tokenizer, "fr")
    sources = [into_french.encode_src(s) + [tokenizer.eos_id] if s else None for s in SENTENCES]
    for settings in (dict(beam=1), dict(beam=3)):
        cfg = decode_cfg(**settings)
        assert texts(translate_encoded(exported, into_french, sources, cfg, "cpu")) == texts(
            translate_encoded(model, into_french, sources, cfg, "cpu")
        )
    assert pieces_seen and {pieces[0] for pieces in pieces_seen} == {"<2fr>"}

    # A decoder that would emit a tag at every step: CTranslate2 suppresses the tags as torch bans them.
    forced = force_tags(model, tokenizer)
    directory = export_ctranslate2(
        forced.state_dict(),
        ModelConfig(**MODEL),
        tokenizer,
        tmp_path / "forced",
        metadata={"data": to_plain(languages.data)},
    )
    forced_ct2 = load_ctranslate2(directory, torch.device("cpu"), "fp32", 1)
    greedy = decode_cfg(beam=1)
    ct2_texts = texts(translate_encoded(forced_ct2, into_french, sources, greedy, "cpu"))
    assert ct2_texts == texts(translate_encoded(forced, into_french, sources, greedy, "cpu"))
    assert ct2_texts[0] == "Hund Hund Hund Hund Hund Hund"


# ------------------------------------------------------------------ validation and the test decode of fit
def encoded(texts_: ParallelText, tokenizer: Tokenizer) -> EncodedCorpus:
    return EncodedCorpus.from_sequences(
        [tokenizer.encode_src(s) + [tokenizer.eos_id] for s in texts_.src],
        [tokenizer.encode_tgt(t) for t in texts_.tgt],
    )


def prepared(corpus: Path, tokenizer: Tokenizer, languages: RunLanguages, directions) -> PreparedData:
    """PreparedData as preparation leaves it for `directions` (each valid set encoded with its tag)."""
    found = []
    for src, tgt in directions:
        tagged = languages.tokenizer_for(tokenizer, tgt)
        text = {
            split: ParallelText(
                (corpus / f"{name}.{src}").read_text(encoding="utf-8").splitlines(),
                (corpus / f"{name}.{tgt}").read_text(encoding="utf-8").splitlines(),
            )
            for split, name in (("valid", "val"), ("test", "test_2016_flickr"))
        }
        found.append(
            DirectionData(
                src,
                tgt,
                list(tagged.source_prefix),
                encoded(text["valid"], tagged),
                text["valid"],
                encoded(text["test"], tagged),
                text["test"],
            )
        )
    first = found[0]
    return PreparedData(
        tokenizer, first.valid, first.valid, first.test, first.valid_text, first.test_text, corpus, directions=found
    )


MACHINE = SimpleNamespace(device=torch.device("cpu"), precision=Precision.fp32, decode_precision=Precision.fp32)


def test_validation_reports_each_direction_and_their_mean(corpus, fit_config, model, tokenizer, languages, monkeypatch):
    from mtrain.cli.fit import validation
    from mtrain.evaluate import scoring
    from mtrain.evaluate.scoring import sentence_translator, translate_and_score
    from mtrain.train.validation import validation_loss

    directions = [("de", "en"), ("en", "fr")]
    data = prepared(corpus, tokenizer, languages, directions)
    cfg = OmegaConf.merge(fit_config, {"train": {"valid_max_sentences": 4}})
    decoded = []
    monkeypatch.setattr(
        scoring,
        "translate_and_score",
        lambda translate, sources, refs, name: (
            decoded.append((name, len(sources))) or translate_and_score(translate, sources, refs, name)
        ),
    )
    seen = EncoderInputs(monkeypatch)
    results = validation(cfg, model, data, MACHINE)()
    assert decoded == [("data.splits.valid=val (de-en)", 4), ("data.splits.valid=val (en-fr)", 4)]
    assert seen.first_tokens() == {tokenizer.symbol_id("<2en>"), tokenizer.symbol_id("<2fr>")}
    for (src, tgt), direction in zip(directions, data.directions, strict=True):
        loss = validation_loss(
            model,
            direction.valid,
            tokenizer.special_ids,
            cfg.train.max_tokens,
            cfg.train.label_smoothing,
            MACHINE.device,
            MACHINE.precision,
        )
        translate = sentence_translator(
            model,
            languages.tokenizer_for(tokenizer, tgt),
            DecodeConfig(beam=1, max_len_a=DECODE["max_len_a"], max_len_b=DECODE["max_len_b"]),
            "cpu",
            Precision.fp32,
        )
        bleu = translate_and_score(translate, direction.valid_text.src[:4], [direction.valid_text.tgt[:4]], "x").scores[
            "bleu"
        ]["score"]
        assert results[f"{src}-{tgt}/ppl"] == pytest.approx(loss["ppl"])
        assert results[f"{src}-{tgt}/bleu"] == pytest.approx(bleu)
    assert results["bleu"] == pytest.approx((results["de-en/bleu"] + results["en-fr/bleu"]) / 2)
    assert results["ppl"] == pytest.approx((results["de-en/ppl"] * results["en-fr/ppl"]) ** 0.5)
    assert set(results) == {"loss", "nll_loss", "ppl", "bleu", "de-en/ppl", "de-en/bleu", "en-fr/ppl", "en-fr/bleu"}


def test_best_checkpoint_follows_the_mean_bleu(corpus, fit_config, model, tokenizer, languages, monkeypatch):
    from mtrain.cli.fit import validation
    from mtrain.evaluate import scoring
    from mtrain.train.progress import TrainState

    # Per validation, each direction's BLEU: de-en gains at the second while the mean falls.
    script = iter([10.0, 20.0, 14.0, 14.0, 12.0, 19.0])
    monkeypatch.setattr(
        scoring, "translate_and_score", lambda *args: SimpleNamespace(scores={"bleu": {"score": next(script)}})
    )
    validate = validation(
        fit_config, model, prepared(corpus, tokenizer, languages, [("de", "en"), ("en", "de")]), MACHINE
    )
    state, best = TrainState(), []
    for update in (100, 200, 300):
        state.update = update
        results = validate()
        best.append((results["bleu"], results["de-en/bleu"], state.record_validation(results)))
    assert best == [(15.0, 10.0, True), (14.0, 14.0, False), (15.5, 12.0, True)]
    assert (state.best_update, state.best_score) == (300, 15.5)


def test_one_direction_validates_as_before(corpus, fit_config, model, tokenizer, monkeypatch):
    from mtrain.cli.fit import validation

    cfg = OmegaConf.structured(FitConfig(model=ModelConfig(**MODEL)))  # de->en, no tags
    cfg.data.local_dir = str(corpus)
    cfg.train.valid_max_sentences = 2
    seen = EncoderInputs(monkeypatch)
    results = validation(cfg, model, prepared(corpus, tokenizer, RunLanguages.of(cfg.data), [("de", "en")]), MACHINE)()
    assert set(results) == {"loss", "nll_loss", "ppl", "bleu"}
    assert not seen.first_tokens() & {tokenizer.symbol_id(tag) for tag in TAGS}


def test_the_test_decode_scores_each_direction_and_their_mean(tmp_path, fit_config, model, tokenizer, languages):
    from mtrain.cli.fit import score_test_split

    directions = [("de", "en"), ("en", "fr")]
    run = write_run(tmp_path / "run", fit_config, tokenizer, model, directions)
    test = score_test_split(fit_config, RunDir(run), model, tokenizer, torch.device("cpu"), Precision.fp32, directions)
    reports = {
        name: json.loads((run / "eval" / f"test.{name}.json").read_text(encoding="utf-8"))
        for name in ("de-en", "en-fr")
    }
    assert not (run / "eval" / "test.json").exists()
    assert set(test["directions"]) == set(reports)
    for name, report in reports.items():
        assert report["language_pair"] == name
        assert test["directions"][name]["bleu"] == pytest.approx(report["metrics"]["bleu"]["score"])
        assert test["directions"][name]["sentences"] == SPLITS["test_2016_flickr"]
    for metric in ("bleu", "chrf", "ter"):
        assert test[metric] == pytest.approx(sum(test["directions"][name][metric] for name in reports) / 2)
    assert (test["checkpoint"], test["update"], test["sentences"]) == ("best.pt", 3, 2 * SPLITS["test_2016_flickr"])
    hyps = (run / "eval" / "test.en-fr.hyp").read_text(encoding="utf-8").splitlines()
    sources = (run / "data" / "test.en-fr.src").read_text(encoding="utf-8").splitlines()
    assert hyps == texts(
        translate_sentences(model, languages.tokenizer_for(tokenizer, "fr"), sources, DecodeConfig(**DECODE), "cpu")
    )


def test_the_preset_trains_the_four_directions_as_the_best_bilingual_preset_trains_one():
    from tests.fit_runs import composed

    multilingual, _ = composed("multi30k_multilingual")
    bilingual, _ = composed("multi30k_cpu_best")
    assert multilingual.data.lang_tags and RunLanguages.of(multilingual.data).directions() == DIRECTIONS
    assert all(corpus.name == "multi30k" for corpus in multilingual.data.corpora)
    for section in ("model", "train", "decode"):  # the same model, budget and decoding
        assert multilingual[section] == bilingual[section], section
    assert (multilingual.tokenizer.vocab_size, bilingual.tokenizer.vocab_size) == (10000, 8000)


# ------------------------------------------------------------------ a multilingual fit, end to end
@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, corpus):
    """`mtrain fit` of the four directions (a tiny model, 6 updates, validated twice); its config,
    metrics and directory."""
    from mtrain.cli.fit import run_fit
    from tests.fit_runs import compose_fit

    work = tmp_path_factory.mktemp("multilingual_fit")
    corpora = ",".join(f"{{name:multi30k,src:{src},tgt:{tgt}}}" for src, tgt in DIRECTIONS)
    cfg = compose_fit(
        [
            f"data.local_dir={corpus}",
            f"data.cache_dir={work / 'cache'}",
            "data.lang_tags=true",
            f"data.corpora=[{corpora}]",
            "tokenizer.vocab_size=400",
            *[f"model.{key}={value}" for key, value in MODEL.items()],
            "train.max_updates=6",
            "train.validate_every=3",
            "train.log_every=3",
            "train.max_tokens=1024",
            "train.num_threads=1",
            "train.valid_max_sentences=4",
            *[f"decode.{key}={value}" for key, value in DECODE.items()],
        ]
    )
    metrics = run_fit(cfg, work / "run")
    return cfg, metrics, work / "run"


def test_a_multilingual_fit_validates_tests_and_decodes_each_direction(trained_run, tmp_path, monkeypatch):
    from mtrain.batches import prepare_data
    from mtrain.evaluate.references import read_run_split

    cfg, metrics, run = trained_run
    names = [f"{src}-{tgt}" for src, tgt in DIRECTIONS]
    # Preparation's tags are those decoding puts in front of a source.
    data = prepare_data(cfg.data, cfg.tokenizer, log=lambda *_: None)
    languages = RunLanguages.of(cfg.data)
    assert [direction.name for direction in data.directions] == names
    for direction in data.directions:
        assert direction.tag_ids == list(languages.tokenizer_for(data.tokenizer, direction.tgt).source_prefix)
        assert direction.tag_ids == [data.tokenizer.symbol_id(f"<2{direction.tgt}>")]
        assert int(direction.valid.src(0)[0]) == direction.tag_ids[0]
    # Validation: each direction and the mean, best.pt on the mean.
    valid = metrics["valid"]
    assert valid["bleu"] == pytest.approx(sum(valid[f"{name}/bleu"] for name in names) / 4)
    assert valid["best_bleu"] >= valid["bleu"] and valid["best_update"] in (3, 6)
    from tests.fit_runs import scalars

    for name in names:  # TensorBoard: each direction's curve beside the mean's (the last validation: update 6)
        assert scalars(run, f"valid/{name}/bleu")[6] == pytest.approx(valid[f"{name}/bleu"])
    assert scalars(run, "valid/bleu")[6] == pytest.approx(valid["bleu"])
    # The test decode: one report per direction, their mean in metrics.json.
    test = metrics["test"]
    assert list(test["directions"]) == names and test["update"] == valid["best_update"]
    assert test["bleu"] == pytest.approx(sum(test["directions"][name]["bleu"] for name in names) / 4)
    for name in names:
        report = json.loads((run / "eval" / f"test.{name}.json").read_text(encoding="utf-8"))
        assert report["language_pair"] == name
        assert report["metrics"]["bleu"]["score"] == pytest.approx(test["directions"][name]["bleu"])
        assert (run / "data" / f"valid.{name}.src").is_file()
    assert not (run / "data" / "test.src").exists() and not (run / "eval" / "test.json").exists()
    # Translate decodes into each language, its tag first in every source and never in the output.
    for tgt in ("en", "de", "fr"):
        seen = EncoderInputs(monkeypatch)
        lines = translate_file(run, tmp_path, tgt_lang=tgt)
        assert len(lines) == len(SENTENCES) and not any("<2" in line for line in lines)
        assert seen.first_tokens() == {data.tokenizer.symbol_id(f"<2{tgt}>")}
        monkeypatch.undo()
    zero_shot = read_run_split(RunDir(run), cfg.data, "test", ("de", "fr"))
    assert (
        zero_shot.references[0]
        == (Path(cfg.data.local_dir) / "test_2016_flickr.fr").read_text(encoding="utf-8").splitlines()
    )
