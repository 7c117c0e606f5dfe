"""Term-aware models (issue 53): sources annotated with terms (mtrain.tokenizer.term_factors), the
training data's terms from word alignments (mtrain.batches.term_training), the factor embedding
(zero at first: a plain parent fine-tuned with factors computes what it did), decoding that
writes a glossary's terms into the source (decode.term_mode) through translate and both APIs,
and the refusals: a misfit file, a model that reads no terms, an export that could not carry them.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from starlette.testclient import TestClient

from mtrain.batches.guided_alignment import word_starts, words_of
from mtrain.checkpoint.files import save_checkpoint
from mtrain.cli.fit import run_fit
from mtrain.config import DecodeConfig, FitConfig, ModelConfig, ServeConfig, to_plain, to_typed, with_resolved_model
from mtrain.config_checks import check_config
from mtrain.decode.requests.controls import line_controls
from mtrain.decode.requests.pipeline import Options, RequestPipeline
from mtrain.decode.requests.request import DecodeRequest
from mtrain.decode.requests.terminology import Glossary
from mtrain.decode.text.stream import translate_stream
from mtrain.decoding_rules import check_term_mode
from mtrain.errors import MtrainError
from mtrain.model import build_model
from mtrain.serve.app import build_app
from mtrain.serve.model import open_served_model
from mtrain.source_factors import PLAIN, TERM_SOURCE, TERM_TARGET, split_ids
from mtrain.tokenizer.term_factors import annotate, fold_term_columns, source_positions
from mtrain.train.init_from import inherited_config, load_parent
from mtrain.train.setup import build_fit, prepare_fit_data, resolve_machine
from tests.conftest import needed_in_ci, test_threads
from tests.decoding_run import TINY_MODEL as MODEL  # the shared `model` fixture's (tests/conftest.py)
from tests.decoding_run import job
from tests.fit_runs import PARENT_MODEL as TINY_MODEL
from tests.fit_runs import QUICK, compose_fit, mtrain, one_error_line

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "align_eflomal.py"
CPU = torch.device("cpu")
V = 100  # a vocabulary size for the id arithmetic


# ------------------------------------------------------------------ the annotated source
def test_a_term_is_written_after_its_source_words_with_their_factors():
    ids = [10, 11, 12, 13, 3]  # ▁Ein ▁gro ßer ▁Hund </s>: words 0, 1, 1, 2
    word_of = [0, 1, 1, 2, -1]
    out = annotate(ids, word_of, [([2], [40, 41]), ([1], [50])], V)
    pieces, factors = split_ids(out, V)
    assert pieces == [10, 11, 12, 50, 13, 40, 41, 3]
    assert factors == [PLAIN, TERM_SOURCE, TERM_SOURCE, TERM_TARGET, TERM_SOURCE, TERM_TARGET, TERM_TARGET, PLAIN]
    # the plain source comes back: every piece not of a term, in order
    assert [p for p, f in zip(pieces, factors, strict=True) if f != TERM_TARGET] == ids
    # alignments see the source as written: a term piece stands for the piece it follows
    assert source_positions(out, V) == [0, 1, 2, 2, 4, 4, 4, 7]
    # a multi-word source term: all its words marked, the term once after the last
    two = annotate(ids, word_of, [([1, 2], [60])], V)
    assert split_ids(two, V)[1] == [PLAIN, TERM_SOURCE, TERM_SOURCE, TERM_SOURCE, TERM_TARGET, PLAIN]
    # a term whose words are not in the sentence, or overlap a marked one, is left out
    assert annotate(ids, word_of, [([7], [60]), ([], [61])], V) == ids
    assert split_ids(annotate(ids, word_of, [([2], [40]), ([2], [41])], V), V)[0] == [10, 11, 12, 13, 40, 3]


def test_attention_on_a_term_counts_for_the_source_word_it_follows():
    ids = annotate([10, 13, 3], [0, 1, -1], [([1], [40, 41])], V)  # 10 13 +40 +41 </s>
    attention = torch.tensor([[0.1, 0.2, 0.3, 0.3, 0.1, 0.0]])  # one padding column past the source
    folded, plain = fold_term_columns(attention, ids, V)
    assert plain == [10, 13, 3]
    assert torch.allclose(folded, torch.tensor([[0.1, 0.8, 0.1, 0.0]]))


def test_the_factor_embedding_starts_at_zero_so_a_plain_models_weights_compute_the_same(tokenizer):
    torch.manual_seed(0)
    sizes = (tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, tokenizer.pad_id)
    plain = build_model(ModelConfig(**MODEL), *sizes, joint_vocab=True).eval()
    aware = build_model(ModelConfig(**MODEL, term_factors=True), *sizes, joint_vocab=True).eval()
    missing, unexpected = aware.load_state_dict(plain.state_dict(), strict=False)
    assert missing == ["src_embed.factors.weight"] and not unexpected
    assert torch.count_nonzero(aware.src_embed.factors.weight) == 0
    src = torch.tensor([tokenizer.encode_src("Ein Hund läuft.") + [tokenizer.eos_id]])
    tgt = torch.tensor([[tokenizer.bos_id, *tokenizer.encode_tgt("A dog")]])
    mask = src == tokenizer.pad_id
    assert torch.equal(plain(src, mask, tgt), aware(src, mask, tgt))
    # once trained, the factor of a piece changes what the encoder reads
    torch.nn.init.normal_(aware.src_embed.factors.weight)
    marked = src + TERM_SOURCE * tokenizer.src_vocab_size * (torch.arange(src.shape[1]) == 1)
    assert not torch.equal(aware(src, mask, tgt), aware(marked, mask, tgt))


def test_placement_ties_a_term_to_its_source_word_and_the_term_written_after_it(tokenizer):
    from mtrain.decode.requests.pipeline import term_sources

    plain = [*tokenizer.encode_src("Ein Hund läuft."), tokenizer.eos_id]
    found = {"canine": [1]}
    assert term_sources(tokenizer, plain, found) == {"canine": tuple(range(1, 1 + len(tokenizer.encode_src("Hund"))))}
    pipeline = RequestPipeline(torch.nn.Linear(1, 1), tokenizer, CPU)
    annotated = pipeline.annotated(plain, found, tokenizer)
    _, factors = split_ids(annotated, tokenizer.src_vocab_size)
    marked = [k for k, f in enumerate(factors) if f in (TERM_SOURCE, TERM_TARGET)]
    assert term_sources(tokenizer, annotated, found) == {"canine": tuple(marked)}
    assert [factors[k] for k in marked][-1] == TERM_TARGET and factors[marked[0]] == TERM_SOURCE


# ------------------------------------------------------------------ training data
@pytest.fixture(scope="module")
def aligned(tmp_path_factory, multi30k_slice) -> Path:
    """eflomal's links of the 2,000 training pairs of the slice (scripts/align_eflomal.py)."""
    needed_in_ci("eflomal", "pip install eflomal")
    spec = importlib.util.spec_from_file_location("align_eflomal", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("align_eflomal", script)
    spec.loader.exec_module(script)
    src = (multi30k_slice / "train.de").read_text(encoding="utf-8").splitlines()
    tgt = (multi30k_slice / "train.en").read_text(encoding="utf-8").splitlines()
    out = tmp_path_factory.mktemp("term_align") / "train.align"
    script.write(out, script.align(src, tgt, "grow-diag-final-and"))
    return out


def term_overrides(multi30k_slice: Path, aligned: Path, cache: Path, *more: str) -> list[str]:
    return [
        f"data.local_dir={multi30k_slice}",
        f"data.cache_dir={cache}",
        *TINY_MODEL,
        *QUICK,
        "model.term_factors=true",
        f"train.term_alignment={aligned}",
        "train.term_rate=0.5",
        *more,
    ]


def prepared(overrides: list[str]):
    cfg = with_resolved_model(compose_fit(overrides))
    check_config(cfg)
    logged: list[str] = []
    return prepare_fit_data(cfg, resolve_machine(cfg), progress=logged.append), logged


def test_a_share_of_the_training_sources_carry_their_own_aligned_content_words_as_terms(
    multi30k_slice, aligned, tmp_path
):
    data, logged = prepared([*term_overrides(multi30k_slice, aligned, tmp_path / "cache"), "train.term_replace_rate=0"])
    tokenizer, vocab = data.tokenizer, data.tokenizer.src_vocab_size
    annotated = [k for k in range(len(data.train)) if (np.asarray(data.train.src(k)) >= vocab).any()]
    assert 0.35 < len(annotated) / len(data.train) < 0.5  # term_rate 0.5 of the pairs, those with a candidate
    (line,) = [line for line in logged if line.startswith("term annotation:")]
    assert f"{len(annotated)} of {len(data.train)} training pairs" in line
    plain, _ = prepared([*term_overrides(multi30k_slice, aligned, tmp_path / "cache"), "train.term_alignment=null"])
    frequent = {"ein", "eine", "einem", "der", "die", "und", "in", "mit", "auf"}
    starts = word_starts(tokenizer, "src")
    for k in annotated[:200]:
        pieces, factors = split_ids(np.asarray(data.train.src(k)).tolist(), vocab)
        # the source as written is still there, in order; the target is untouched
        assert [p for p, f in zip(pieces, factors, strict=True) if f != TERM_TARGET] == plain.train.src(k).tolist()
        assert data.train.tgt(k).tolist() == plain.train.tgt(k).tolist()
        reference = " " + tokenizer.decode_tgt(data.train.tgt(k).tolist()) + " "
        assert 1 <= sum(f == TERM_SOURCE and starts[p] for p, f in zip(pieces, factors, strict=True)) <= 3
        run: list[int] = []
        for position, (piece, factor) in enumerate(zip(pieces, factors, strict=True)):
            if factor == TERM_TARGET:
                run.append(piece)
            if run and (position + 1 == len(pieces) or factors[position + 1] != TERM_TARGET):
                term = tokenizer.decode_tgt(run)  # (joint vocabulary: the same pieces)
                assert term in reference, (term, reference)  # the pair's own target words
                run = []
        marked = words_of(np.asarray([p for p, f in zip(pieces, factors, strict=True) if f == TERM_SOURCE]), starts)
        words = tokenizer.decode_tgt([p for p, f in zip(pieces, factors, strict=True) if f == TERM_SOURCE])
        assert len(marked) and not set(words.casefold().strip(".,").split()) & frequent, words


def test_a_replacing_term_is_written_into_the_target_in_place_of_the_aligned_words(multi30k_slice, aligned, tmp_path):
    cache = tmp_path / "cache"
    data, logged = prepared([*term_overrides(multi30k_slice, aligned, cache), "train.term_replace_rate=1"])
    plain, _ = prepared([*term_overrides(multi30k_slice, aligned, cache), "train.term_alignment=null"])
    tokenizer, vocab = data.tokenizer, data.tokenizer.src_vocab_size
    changed = annotated = 0
    for k in range(len(data.train)):
        pieces, factors = split_ids(np.asarray(data.train.src(k)).tolist(), vocab)
        if TERM_TARGET not in factors:
            assert data.train.tgt(k).tolist() == plain.train.tgt(k).tolist()  # no term, the target as it was
            continue
        annotated += 1
        target = tokenizer.decode_tgt(data.train.tgt(k).tolist())
        original = tokenizer.decode_tgt(plain.train.tgt(k).tolist())
        changed += target != original
        terms, run = [], []
        for position, factor in enumerate(factors):
            if factor == TERM_TARGET:
                run.append(pieces[position])
            elif run:
                terms.append(tokenizer.decode_tgt(run))
                run = []
        for term in terms:  # the target holds the term (capitalised where it starts the sentence)
            assert term in target or term[:1].upper() + term[1:] in target, (term, target, original)

        # the words around the replaced ones stay: every word the original lacks is a word of a term
        def bare(word: str) -> str:
            return word.strip(".,;:!?\"'()").casefold()

        term_words = {bare(word) for term in terms for word in term.split()}
        assert {bare(word) for word in set(target.split()) - set(original.split())} <= term_words, (target, terms)
    assert changed > 0.9 * annotated  # (a drawn term may be the word's own)
    (line,) = [line for line in logged if line.startswith("term annotation:")]
    assert "of them replacing their target words by another term" in line


def test_the_annotation_is_drawn_from_the_seed(multi30k_slice, aligned, tmp_path):
    first, _ = prepared(term_overrides(multi30k_slice, aligned, tmp_path / "cache"))
    again, _ = prepared(term_overrides(multi30k_slice, aligned, tmp_path / "cache"))
    other, _ = prepared([*term_overrides(multi30k_slice, aligned, tmp_path / "cache"), "seed=2"])
    assert np.array_equal(first.train.src_tokens, again.train.src_tokens)
    assert not np.array_equal(first.train.src_tokens, other.train.src_tokens)


def test_a_misfit_alignment_file_or_setting_is_one_line_naming_it(multi30k_slice, aligned, tmp_path):
    lines = aligned.read_text(encoding="utf-8").splitlines()
    short = tmp_path / "short.align"
    short.write_text("\n".join(lines[:10]) + "\n", encoding="utf-8")
    bad = tmp_path / "bad.align"
    bad.write_text("\n".join([*lines[:4], "0-0 99-0", *lines[5:]]) + "\n", encoding="utf-8")
    cache = tmp_path / "cache"
    with pytest.raises(
        MtrainError, match=r"train.term_alignment: .*short.align has 10 lines, the training corpus 2000"
    ):
        prepared([*term_overrides(multi30k_slice, short, cache), "train.term_rate=1"])
    with pytest.raises(MtrainError, match=r"train.term_alignment: .*bad.align:5: link 99-0 is out of range"):
        prepared([*term_overrides(multi30k_slice, bad, cache), "train.term_rate=1"])
    refusals = [
        (["model.term_factors=false"], "train.term_alignment: the model reads its terms through a source factor; "
         "add model.term_factors=true"),
        ([f"train.guided_alignment={aligned}", "train.guided_alignment_layer=0"],
         "train.term_alignment: not with train.guided_alignment"),
        (["data.lang_tags=true"], "train.term_alignment: not with data.lang_tags"),
        ([f"train.term_alignment={tmp_path / 'none.align'}"], "train.term_alignment: "),
        (["train.term_rate=1.5"], "train.term_rate"),
    ]  # fmt: skip
    for more, message in refusals:
        with pytest.raises(MtrainError, match=message.replace("(", r"\(").replace(")", r"\)")):
            prepared([*term_overrides(multi30k_slice, aligned, cache), *more])


def test_an_alignment_file_that_is_not_utf8_or_yields_no_term_is_refused_in_one_line(multi30k_slice, aligned, tmp_path):
    """Issue 58 item 4: a binary file was a UnicodeDecodeError traceback; empty links or
    term_rate=0 trained a 'term-aware' model that never saw a term, saying so only in a count."""
    cache = tmp_path / "cache"
    lines = aligned.read_text(encoding="utf-8").splitlines()
    binary = tmp_path / "binary.align"
    binary.write_bytes(
        ("\n".join(lines[:6]) + "\n").encode() + b"0-0 \xff\xfe1-1\n" + ("\n".join(lines[7:]) + "\n").encode()
    )
    with pytest.raises(MtrainError, match=r"train.term_alignment: .*binary.align:7: not valid UTF-8") as refused:
        prepared([*term_overrides(multi30k_slice, binary, cache), "train.term_rate=1"])
    assert "\n" not in str(refused.value)
    empty = tmp_path / "empty.align"
    empty.write_text("\n" * len(lines), encoding="utf-8")
    with pytest.raises(MtrainError, match=r"empty.align: 0 candidate words .* in the 2000 pairs drawn \(0 links"):
        prepared([*term_overrides(multi30k_slice, empty, cache), "train.term_rate=1"])
    with pytest.raises(MtrainError, match=r"train.term_rate=0.0: drew none of the 2000 training pairs"):
        prepared([*term_overrides(multi30k_slice, aligned, cache), "train.term_rate=0"])


def test_resuming_with_another_alignment_file_is_refused_and_another_rate_is_said(aligned, tmp_path, caplog):
    """Issue 58 item 4: a resume drew its terms from whatever file and rate it was given, silently."""
    from mtrain.train.checkpointer import check_resumable_terms

    saved = {"config": {"train": {"term_alignment": str(aligned), "term_rate": 0.5, "term_max_words": 3}}}
    cfg = compose_fit([f"train.term_alignment={aligned}", "train.term_rate=0.5", "train.term_max_words=3"])
    check_resumable_terms(saved, cfg, tmp_path / "last.pt")  # the same: nothing to say
    other = tmp_path / "other.align"
    other.write_text("0-0\n", encoding="utf-8")
    for given in (f"train.term_alignment={other}", "train.term_alignment=null"):
        with pytest.raises(MtrainError, match=r"last.pt: checkpoint was trained with train.term_alignment=") as refused:
            check_resumable_terms(saved, compose_fit([given]), tmp_path / "last.pt")
        assert "nothing was written" in str(refused.value)
    moved = tmp_path / "moved" / "train.align"  # the same file by another path is the same data
    moved.parent.mkdir()
    moved.symlink_to(aligned)
    check_resumable_terms(saved, compose_fit([f"train.term_alignment={moved}", "train.term_max_words=3"]), tmp_path)
    caplog.clear()
    with caplog.at_level("INFO", logger="mtrain"):
        check_resumable_terms(saved, compose_fit([f"train.term_alignment={aligned}", "train.term_rate=0.8",
                                                  "train.term_max_words=3"]), tmp_path)  # fmt: skip
    assert "train.term_rate 0.5 -> 0.8: the term annotation is drawn again" in caplog.text


# ------------------------------------------------------------------ fine-tuning a plain run, decoding with terms
@pytest.fixture(scope="module")
def term_run(tmp_path_factory, parent, multi30k_slice, aligned) -> Path:
    """test_finetune's plain `parent` fine-tuned with term annotation (init_from, model.term_factors=true)."""
    base = tmp_path_factory.mktemp("term_child")
    overrides = [
        f"init_from={parent}",
        f"data.local_dir={multi30k_slice}",
        f"data.cache_dir={base / 'cache'}",
        *QUICK,
        "model.term_factors=true",
        f"train.term_alignment={aligned}",
        "data.train_limit=300",
        "train.max_updates=3",
        "train.validate_every=3",
    ]
    cfg = with_resolved_model(compose_fit(overrides))
    loaded = load_parent(str(parent), "auto", False, cfg.data)
    child = inherited_config(cfg, loaded.config, overrides, "init_from")
    machine = resolve_machine(child)
    data = prepare_fit_data(child, machine, progress=lambda *_: None, tokenizer=loaded.tokenizer)
    model = build_fit(child, machine, data, init=loaded).model.eval()
    # before its first update the fine-tune computes exactly what its parent does
    plain_cfg = dataclasses.replace(child, model=dataclasses.replace(child.model, term_factors=False))
    plain = build_fit(plain_cfg, machine, data, init=loaded).model.eval()
    tokenizer = loaded.tokenizer
    src = torch.tensor([[*tokenizer.encode_src("Ein Hund."), tokenizer.eos_id]])
    tgt = torch.tensor([[tokenizer.bos_id]])
    assert torch.equal(model(src, src == tokenizer.pad_id, tgt), plain(src, src == tokenizer.pad_id, tgt))
    run_fit(compose_fit(overrides), base / "run", command_line=overrides)
    return base / "run"


def test_a_fine_tune_turns_a_plain_run_term_aware_and_translate_writes_the_terms_into_its_source(
    term_run, parent, tmp_path
):
    from mtrain.checkpoint.files import load_run

    loaded = load_run(term_run, "best")
    assert loaded.config.model.term_factors and loaded.config.init_from == str(parent)
    model, tokenizer = loaded.model.eval(), loaded.tokenizer
    glossary = Glossary.of({"Hund": "canine"})
    vocab = tokenizer.src_vocab_size
    for mode, annotated, constrained in (
        ("auto", True, True),
        ("annotation", True, False),
        ("constraints", False, True),
    ):
        pipeline = RequestPipeline(model, tokenizer, CPU)
        options = Options(
            decode=to_typed(OmegaConf.merge(OmegaConf.structured(DecodeConfig), {"beam": 2, "term_mode": mode})),
            glossary=glossary,
        )
        requests = [DecodeRequest("Ein Hund läuft.", where="x:1")]
        sentences = pipeline.begin(requests, options).requests
        pipeline.decode(sentences, options.decoding())
        pieces, factors = split_ids(sentences[0].ids, vocab)
        assert (TERM_TARGET in factors) is annotated, mode
        if annotated:
            term = [p for p, f in zip(pieces, factors, strict=True) if f == TERM_TARGET]
            assert tokenizer.decode_tgt(term) == "canine"
            assert tokenizer.decode_tgt([p for p, f in zip(pieces, factors, strict=True) if f == TERM_SOURCE]) == "Hund"
        assert ("canine" in sentences[0].constraints) is constrained
    # the plain parent reads no terms: asking for annotation is one line
    with pytest.raises(MtrainError, match="decode.term_mode=annotation: this model reads no terms in its source"):
        check_term_mode(DecodeConfig(term_mode="annotation"), glossary=True, term_aware=False)
    terms = tmp_path / "terms.tsv"
    terms.write_text("Hund\tcanine\n", encoding="utf-8")
    source = tmp_path / "in.de"
    source.write_text("Ein Hund läuft.\n", encoding="utf-8")
    result = mtrain("translate", f"run={parent}", f"input={source}", f"terms={terms}", "decode.term_mode=annotation")
    assert result.returncode == 2 and "decode.term_mode=annotation: this model reads no terms" in one_error_line(result)
    # word alignments and markup see the source as the user wrote it
    result = mtrain("translate", f"run={term_run}", f"input={source}", f"terms={terms}", "decode.alignment=true", "decode.alignment_layer=-1",
                    "decode.beam=2", f"num_threads={test_threads()}")  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    links = [tuple(map(int, link.split("-"))) for link in result.stdout.split("\t")[1].split()]
    assert links and all(0 <= i < 3 for i, _ in links)  # three source words, whatever the terms added


def test_exports_refuse_a_term_aware_model_in_one_line(term_run, tmp_path):
    for fmt, out, engine in (("ctranslate2", "ct2", "CTranslate2"), ("hf", "hf", "transformers"),
                             ("argos", "x.argosmodel", "CTranslate2")):  # fmt: skip
        result = mtrain("export", f"run={term_run}", f"format={fmt}", f"out={tmp_path / out}")
        line = one_error_line(result)
        assert result.returncode == 2 and "model.term_factors=true" in line and engine in line, line
        assert not (tmp_path / out).exists()


# ------------------------------------------------------------------ serve: the server glossary and a request's terms
@pytest.fixture(scope="module")
def aware_run(tmp_path_factory, tokenizer) -> Path:
    """A term-aware run with trained-looking (random, non-zero) factor vectors: annotation shows."""
    torch.manual_seed(0)
    model = build_model(
        ModelConfig(**MODEL, term_factors=True),
        tokenizer.src_vocab_size,
        tokenizer.tgt_vocab_size,
        tokenizer.pad_id,
        joint_vocab=tokenizer.joint,
    ).eval()
    torch.nn.init.normal_(model.src_embed.factors.weight)
    directory = tmp_path_factory.mktemp("aware_run")
    tokenizer.save(directory / "tokenizer")
    config = to_plain(OmegaConf.structured(FitConfig(model=ModelConfig(**MODEL, term_factors=True))))
    save_checkpoint(directory / "checkpoints" / "best.pt", {"model": model.state_dict(), "config": config, "update": 3})
    return directory


def test_serve_annotates_the_server_glossary_and_a_requests_terms_as_translate_does(aware_run, tmp_path):
    decode = {"beam": 2, "max_len_a": 0.5, "max_len_b": 3}
    cfg = ServeConfig(run=str(aware_run), device="cpu", precision="fp32", decode=to_typed(
        OmegaConf.merge(OmegaConf.structured(DecodeConfig), decode)))  # fmt: skip
    served = open_served_model(cfg, CPU, 1)
    model = served.engine.model
    seen: list[int] = []
    model.src_embed.register_forward_hook(lambda _m, args, _out: seen.append(int(args[0].max())))
    vocab = served.tokenizer.src_vocab_size
    terms = tmp_path / "terms.tsv"
    terms.write_text("Hund\tcanine\n", encoding="utf-8")
    source = tmp_path / "in.de"
    sentences = ["Ein Hund läuft.", "Eine Frau spielt."]
    source.write_text("".join(s + "\n" for s in sentences), encoding="utf-8")
    out = tmp_path / "out.en"
    glossary = line_controls("none", str(terms), False, None)
    translate_stream(served.engine, served.tokenizer, job(input=str(source), output=str(out), decode=decode), CPU,
                     "fp32", glossary)  # fmt: skip
    lines = out.read_text(encoding="utf-8").splitlines()
    assert seen and max(seen) >= TERM_TARGET * vocab  # translate wrote the term into the source
    plain_out = tmp_path / "plain.en"
    translate_stream(served.engine, served.tokenizer, job(input=str(source), output=str(plain_out),
                     decode={**decode, "term_mode": "constraints"}), CPU, "fp32", glossary)  # fmt: skip
    assert lines != plain_out.read_text(encoding="utf-8").splitlines()  # the factors change the translation
    seen.clear()
    with TestClient(build_app(served, cfg), base_url="http://localhost") as api:
        own = api.post("/translate", json={"text": sentences, "terms": [["Hund", "canine"]]})
        assert own.status_code == 200 and own.json()["translations"] == lines
        assert max(seen) >= TERM_TARGET * vocab
        libre = api.post("/translate", json={"q": sentences, "source": "de", "target": "en", "terms": "Hund\tcanine"})
        assert libre.status_code == 200 and libre.json()["translatedText"] == lines
    server_cfg = ServeConfig(**{**cfg.__dict__, "terms": str(terms)})
    with TestClient(build_app(served, server_cfg), base_url="http://localhost") as api:
        assert api.post("/translate", json={"text": sentences}).json()["translations"] == lines


# ------------------------------------------------------------------ the words a term replaces
def test_the_words_a_term_replaces_are_avoided_where_the_term_applies():
    from mtrain.decode.requests.pipeline import prepare_requests

    glossary = Glossary.of(
        {"Hund": "canine", "Mann": "gentleman", "Hundeführer": "dog handler"},
        replaced={"Hund": ["dog", "dogs"], "Mann": ["man"], "Hundeführer": ["dog", "handler"]},
    )
    assert glossary.replaced_in("Ein Hund.") == {"canine": ["dog", "Dog", "dogs", "Dogs"]}
    # a word the term itself holds is not avoided (the term could not be written)
    assert glossary.replaced_in("Ein Hundeführer.") == {"dog handler": []}
    # nor a word it starts with (avoided pieces would ban the term's first piece: road, roadway)
    assert Glossary.of({"Straße": "roadway"}, replaced={"Straße": ["road", "street"]}).replaced_in("Die Straße.") == {
        "roadway": ["street", "Street"]
    }
    requests = [DecodeRequest("Ein Mann mit Hund.", avoid=("the",)), DecodeRequest("Eine Frau.")]
    on = Options(decode=DecodeConfig(), glossary=glossary)
    first, second = prepare_requests(requests, on)
    assert first.avoid == ("the", "man", "Man", "dog", "Dog", "dogs", "Dogs")
    assert set(first.constraints) == {"gentleman", "canine"} and not second.controlled
    # a request's own terms keep the server glossary's replaced words for the others
    merged = glossary.with_terms([("Hund", "hound")])
    assert merged.replaced_in("Ein Mann mit Hund.") == {"gentleman": ["man", "Man"], "hound": []}
    (off, _) = prepare_requests(requests, Options(decode=DecodeConfig(term_avoid_replaced=False), glossary=glossary))
    assert off.avoid == ("the",)
