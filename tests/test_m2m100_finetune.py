"""Fine-tuning an imported M2M100/NLLB-200 model (`mtrain fit init_from=<directory>`): the training
batches are laid out as transformers and fairseq train these models (source `[src_lang] x </s>`,
decoder input `</s> [tgt_lang] y`, labels `[tgt_lang] y </s>`), the loss falls, the fine-tuned
weights loaded into transformers' M2M100 give the run's log-probs, and resume and EMA work.
Small random-weight models built offline (tests/m2m100_dirs.py, the session fixtures)."""

from __future__ import annotations

import shutil

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed: reading HF models is optional (pip install 'mtrain[hf]')"
)

from mtrain.batches import prepare_data  # noqa: E402
from mtrain.batches.batching import collate  # noqa: E402
from mtrain.batches.prepare import language_prefixes  # noqa: E402
from mtrain.batches.training_set import training_set  # noqa: E402
from mtrain.checkpoint.files import load_run  # noqa: E402
from mtrain.checkpoint.hf_weights import layer_names  # noqa: E402
from mtrain.cli.fit import run_fit  # noqa: E402
from mtrain.config import DataConfig, DecodeConfig, Engine, TokenizerConfig  # noqa: E402
from mtrain.data.corpora import training_corpora  # noqa: E402
from mtrain.data.sources import resolve_source  # noqa: E402
from mtrain.decode.translation.translator import translate_encoded  # noqa: E402
from mtrain.errors import MtrainError  # noqa: E402
from mtrain.export.engine import open_engine  # noqa: E402
from mtrain.export.hf_generation import max_new_tokens  # noqa: E402
from mtrain.serve.model import check_target_language, served_directions  # noqa: E402
from mtrain.tokenizer import Tokenizer  # noqa: E402
from tests.conftest import test_threads  # noqa: E402
from tests.fit_runs import compose_fit, scalars  # noqa: E402

FIT = [
    "data.train_limit=300",
    "data.splits.test=null",
    "train.max_updates=8",
    "train.validate_every=4",
    "train.valid_bleu=false",
    "train.max_tokens=1024",
    "train.lr=3e-3",
    "train.warmup_updates=1",
    "train.precision=fp32",
    "train.log_every=1",
    "train.loss_every=2",
    f"train.num_threads={test_threads()}",
]


@pytest.fixture(autouse=True)
def _quiet_transformers(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def nllb_tokenizer(directory):
    return transformers.NllbTokenizer.from_pretrained(directory, src_lang="deu_Latn", tgt_lang="eng_Latn")


def test_training_batches_are_laid_out_as_transformers_trains_m2m100(nllb_dir, multi30k_slice, tmp_path):
    theirs = nllb_tokenizer(nllb_dir)
    tokenizer = Tokenizer.load(nllb_dir)
    data_cfg = DataConfig(src="de", tgt="en", local_dir=str(multi30k_slice), cache_dir=str(tmp_path / "cache"))
    data_cfg.train_limit = 50
    data_cfg.num_workers = 1
    prepared = prepare_data(data_cfg, TokenizerConfig(), log=lambda _: None, tokenizer=tokenizer)
    pairs = list(zip(prepared.valid_text.src, prepared.valid_text.tgt, strict=True))[:6]
    batch = collate(prepared.valid, range(6), tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id)
    hf = theirs([s for s, _ in pairs], text_target=[t for _, t in pairs], return_tensors="pt", padding=True)
    labels = hf["labels"]  # [eng_Latn] y </s>, padded
    decoder_input = transformers.models.m2m_100.modeling_m2m_100.shift_tokens_right(
        labels, theirs.pad_token_id, decoder_start_token_id=2
    )  # </s> [eng_Latn] y
    assert torch.equal(batch.src_tokens[:, : hf["input_ids"].shape[1]], hf["input_ids"])
    assert torch.equal(batch.tgt_output[:, : labels.shape[1]], labels)
    real = labels.ne(theirs.pad_token_id)  # (a padded row's next input is transformers' shifted </s>: unscored)
    assert torch.equal(batch.tgt_input[:, : labels.shape[1]][real], decoder_input[real])
    assert batch.num_tgt_tokens == int(labels.ne(theirs.pad_token_id).sum())  # the language token's label counts
    # the training split too: every source and target starts with its language's token
    train_batch = collate(prepared.train, range(8), tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id)
    english = tokenizer.with_languages("de", "en")
    assert train_batch.tgt_output[:, 0].tolist() == [english.target_prefix[0]] * 8
    assert train_batch.tgt_input[:, :2].tolist() == [[tokenizer.eos_id, english.target_prefix[0]]] * 8
    assert train_batch.src_tokens[:, 0].tolist() == [english.source_prefix[0]] * 8


def test_the_target_prefix_is_part_of_the_cache_key(nllb_dir, multi30k_slice, tmp_path):
    """Encoded targets of another target language are another entry, never the one found."""
    tokenizer = Tokenizer.load(nllb_dir)
    data_cfg = DataConfig(src="de", tgt="en", local_dir=str(multi30k_slice), cache_dir=str(tmp_path / "cache"))
    data_cfg.train_limit = 20
    data_cfg.num_workers = 1
    corpus = training_corpora(data_cfg, resolve_source(data_cfg))[0]
    english, french = (language_prefixes(tokenizer, "de", tgt) for tgt in ("en", "fr"))
    assert english[0] == french[0] and english[1] != french[1]
    sets = [
        training_set(corpus, data_cfg, tokenizer, tokenizer.model_files, source, None, lambda _: None, target)
        for source, target in (english, french)
    ]
    assert sets[0].entry != sets[1].entry and not sets[1].cache_hit
    for encoded, (_, target) in zip(sets, (english, french), strict=True):
        batch = collate(encoded.corpus, range(5), tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id)
        assert batch.tgt_output[:, 0].tolist() == target * 5


def hf_model_with(run_model, directory):
    """transformers' M2M100 from `directory` with the weights of mtrain's `run_model` (the inverse
    of the import's name map, mtrain/checkpoint/hf_m2m100.py)."""
    hf_model = transformers.M2M100ForConditionalGeneration.from_pretrained(directory)
    ours = run_model.state_dict()
    state = hf_model.state_dict()
    cfg = hf_model.config
    for theirs, name in layer_names(cfg.encoder_layers, cfg.decoder_layers, final_norms=True).items():
        state[theirs] = ours[name].float()
    shared = state["model.shared.weight"].clone()
    pieces = min(shared.shape[0], ours["src_embed.tokens.weight"].shape[0])
    shared[:pieces] = ours["src_embed.tokens.weight"][:pieces].float()
    for name in ("model.shared.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
                 "lm_head.weight"):  # fmt: skip
        if name in state:
            state[name] = shared
    hf_model.load_state_dict(state, strict=False)
    return hf_model.eval()


def test_fine_tuning_lowers_the_loss_and_transformers_computes_the_runs_log_probs(nllb_dir, multi30k_slice, tmp_path):
    overrides = [f"init_from={nllb_dir}", f"data.local_dir={multi30k_slice}", f"data.cache_dir={tmp_path / 'cache'}"]
    run_fit(compose_fit([*overrides, *FIT, "train.ema_decay=0.9"]), tmp_path / "run")
    losses = scalars(tmp_path / "run", "train/loss")
    assert all(torch.isfinite(torch.tensor(v)) for v in losses.values())
    steps = sorted(losses)
    assert losses[steps[-1]] < losses[steps[0]]
    valid = scalars(tmp_path / "run", "valid/loss")
    assert valid[max(valid)] < valid[min(valid)]

    loaded = load_run(tmp_path / "run", which="last")
    tokenizer = loaded.tokenizer.with_languages("de", "en")
    model = loaded.model.float().eval()
    hf_model = hf_model_with(model, nllb_dir)
    theirs = nllb_tokenizer(nllb_dir)
    pairs = [("Zwei Hunde spielen im Park.", "Two dogs play in the park."), ("Ein Mann fährt Rad.", "A man rides.")]
    batch = theirs([s for s, _ in pairs], text_target=[t for _, t in pairs], return_tensors="pt", padding=True)
    labels = batch["labels"]
    decoder_input = transformers.models.m2m_100.modeling_m2m_100.shift_tokens_right(labels, tokenizer.pad_id, 2)
    with torch.no_grad():
        ours = model(batch["input_ids"], batch["attention_mask"].eq(0), decoder_input)
        hf_logits = hf_model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], decoder_input_ids=decoder_input
        ).logits
    rows = tokenizer.tgt_vocab_size
    real = labels.ne(tokenizer.pad_id)
    ours_lp = ours[..., :rows].float().log_softmax(-1)[real]
    hf_lp = hf_logits[..., :rows].log_softmax(-1)[real]
    assert torch.allclose(ours_lp, hf_lp, atol=1e-4, rtol=0)
    parent = transformers.M2M100ForConditionalGeneration.from_pretrained(nllb_dir).eval()
    with torch.no_grad():
        before = parent(**batch).loss
        after = hf_model(**batch).loss  # transformers' own loss on its own labels: the fine-tune helped
    assert after < before


def test_a_fine_tune_resumes_exactly(nllb_dir, multi30k_slice, tmp_path):
    common = [f"init_from={nllb_dir}", f"data.local_dir={multi30k_slice}", f"data.cache_dir={tmp_path / 'cache'}",
              *FIT, "train.max_updates=6", "train.validate_every=3", "train.ema_decay=0.9"]  # fmt: skip
    run_fit(compose_fit(common), tmp_path / "straight")
    interrupted = tmp_path / "interrupted"
    run_fit(compose_fit([*common, "train.max_updates=3"]), interrupted)
    resume = [o for o in common if not o.startswith("init_from=")] + ["train.resume=true"]
    run_fit(compose_fit(resume), interrupted)
    expected, resumed = scalars(tmp_path / "straight", "train/loss"), scalars(interrupted, "train/loss")
    assert sorted(resumed) == sorted(expected)
    for step, value in expected.items():
        assert resumed[step] == pytest.approx(value, rel=1e-5), step
    shutil.rmtree(tmp_path / "cache")


# ------------------------------------------------------------------ tgt_lang per request
@pytest.fixture(scope="module")
def fine_tuned(nllb_dir, multi30k_slice, tmp_path_factory):
    """A de->en fine-tune of the small NLLB (2 updates) and transformers' M2M100 with its weights."""
    out = tmp_path_factory.mktemp("nllb_fine_tuned")
    overrides = [f"init_from={nllb_dir}", f"data.local_dir={multi30k_slice}", f"data.cache_dir={out / 'cache'}"]
    run_fit(compose_fit([*overrides, *FIT, "train.max_updates=2", "train.validate_every=2"]), out / "run")
    engine = open_engine(out / "run", Engine.torch, torch.device("cpu"), "fp32", checkpoint="last")
    return out / "run", engine, hf_model_with(engine.model.float().eval(), nllb_dir)


@pytest.mark.parametrize("tgt_lang", ["en", "fra_Latn", "deu_Latn"])
def test_tgt_lang_forces_its_language_token_as_transformers_generate_does(fine_tuned, nllb_dir, tgt_lang):
    """One fine-tuned de->en model translates into every language it knows: `tgt_lang` picks the
    forced first token, and greedy outputs equal generate(forced_bos_token_id=...)."""
    _, engine, hf_model = fine_tuned
    tokenizer = engine.tokenizer_for(tgt_lang)
    code = {"en": "eng_Latn"}.get(tgt_lang, tgt_lang)
    assert tokenizer.target_prefix == (tokenizer.piece_id(code),)
    theirs = transformers.NllbTokenizer.from_pretrained(nllb_dir, src_lang="deu_Latn", tgt_lang=code)
    cfg = DecodeConfig(beam=1)
    sources = ["Zwei Hunde spielen im Park.", "Ein Mann fährt mit dem Fahrrad.", "Eine Frau liest ein Buch."]
    encoded = [tokenizer.encode_src(source) + [tokenizer.eos_id] for source in sources]
    ours = [hyps[0].tokens for hyps in translate_encoded(engine.model, tokenizer, encoded, cfg, torch.device("cpu"))]
    # mtrain never emits a language token but the forced one; transformers' generate has no rule for
    # that (forced_bos_token_id only forces the first), and its suppress_tokens runs after the forcing,
    # which it would undo: so the forced token is given as the decoder's prefix, every language token
    # suppressed after it
    suppress = [tokenizer.pad_id, *tokenizer.tag_ids, *range(tokenizer.tgt_vocab_size, hf_model.config.vocab_size)]
    for source, ids, tokens in zip(sources, encoded, ours, strict=True):
        assert theirs(source)["input_ids"] == ids
        assert tokens[0] == tokenizer.target_prefix[0]
        limit = max_new_tokens(len(ids), cfg.max_len_a, cfg.max_len_b, 128)
        with torch.no_grad():
            generated = hf_model.generate(
                **theirs(source, return_tensors="pt"),
                decoder_input_ids=torch.tensor([[tokenizer.bos_id, tokenizer.target_prefix[0]]]),
                num_beams=1,
                do_sample=False,
                max_new_tokens=limit,
                forced_eos_token_id=tokenizer.eos_id,
                suppress_tokens=suppress,
            )
        row = generated[0, 1:].tolist()
        assert (row[: row.index(tokenizer.eos_id)] if tokenizer.eos_id in row else row) == tokens, source


def test_the_same_sentence_into_two_languages_starts_with_two_tokens(fine_tuned):
    _, engine, _ = fine_tuned
    firsts = []
    for tgt_lang in ("en", "fra_Latn"):
        tokenizer = engine.tokenizer_for(tgt_lang)
        ids = [tokenizer.encode_src("Zwei Hunde spielen im Park.") + [tokenizer.eos_id]]
        hyp = translate_encoded(engine.model, tokenizer, ids, DecodeConfig(beam=1), torch.device("cpu"))[0][0]
        firsts.append(hyp.tokens[0])
    assert firsts[0] != firsts[1]


def test_an_unknown_tgt_lang_is_refused_naming_the_nearest_codes(fine_tuned):
    _, engine, _ = fine_tuned
    with pytest.raises(MtrainError, match=r"^tgt_lang=fra_Latm: not a language of this NLLB model .*nearest: fra_Latn"):
        engine.tokenizer_for("fra_Latm")


def test_serve_offers_every_language_of_the_model_and_defaults_to_the_runs_target(fine_tuned):
    _, engine, _ = fine_tuned
    languages = engine.languages
    targets = languages.model_targets(engine.tokenizer)
    assert targets[0] == "en" and "fra_Latn" in targets and len(targets) > 200
    directions = served_directions(languages, targets)
    assert list(directions) == ["de"] and "fra_Latn" in directions["de"] and "de" not in directions["de"]
    assert check_target_language(None, targets, "en") == "en"
    assert check_target_language("fra_Latn", targets, "en") == "fra_Latn"
