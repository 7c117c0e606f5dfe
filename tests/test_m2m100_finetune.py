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
from mtrain.config import DataConfig, TokenizerConfig  # noqa: E402
from mtrain.data.corpora import training_corpora  # noqa: E402
from mtrain.data.sources import resolve_source  # noqa: E402
from mtrain.tokenizer import Tokenizer  # noqa: E402
from tests.conftest import test_threads  # noqa: E402
from tests.test_fit import compose_fit, run_fit, scalars  # noqa: E402

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
