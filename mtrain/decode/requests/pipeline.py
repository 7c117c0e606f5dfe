"""One path from a request to the decoder, for `mtrain translate`, `mtrain eval` and both HTTP APIs.

A request is sentences (`DecodeRequest`, mtrain.decode.requests.request: the text, its prefix,
constraints and avoided phrases; one object per sentence from the input to its result) and
what is asked of all of them (`Options`: the decode settings, `format`, the
target language, a glossary, attention pictures). `RequestPipeline` takes it through the same
steps wherever it came from:

1. `check`: what is asked, by the names the user gave it (`Options.names`), against the decode
   settings and the engine (`mtrain.decoding_rules`: the rules the config checks apply too);
2. `prepare`: inline markup taken out (`format=xml|html`, `mtrain.decode.requests.markup`), the
   glossary's terms found in the plain text and added to its constraints
   (`mtrain.decode.requests.terminology`; `decode.term_mode`: `mtrain.decoding_rules.TermUse`);
3. `decode` (a batch of prepared sentences, of one request or, in the server's batcher, of
   several): sources encoded and cut to the input limit, a term-aware model's terms written
   into them (mtrain.tokenizer.term_factors), controls encoded as target ids
   (`mtrain.decode.requests.controls`), word alignments forced where markup needs them, decoded by the
   engine (with MBR or reranking around it: `mtrain.decode.selection.selecting`) through the translator;
4. `finish`: the tags put back by the alignments, links dropped unless asked for, the
   constraints and terms that were applied and met counted (`PipelineStats`), and, where
   `Options.confidence` asks for it, each hypothesis' confidence score
   (`mtrain.decode.translation.confidence`; a blank source's: None).

`begin_translation` is the one place these are sequenced: it checks and prepares a request's
sentences into a `Translation`, which its caller decodes (`RequestPipeline.decode`, in-process
for translate and eval; the server's batcher for both HTTP APIs, which knows nothing of HTTP)
and hands to `Translation.finish`. `RequestPipeline.translate` is the in-process whole. The
callers only read their input (a file's lines, a JSON body, LibreTranslate's fields) into
requests and write the results out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from mtrain.config import DecodeConfig, Precision, to_typed
from mtrain.decode.engines.engine import Engine, as_engine
from mtrain.decode.requests.controls import PhraseEncoder, encode_request, phrase_encoder
from mtrain.decode.requests.markup import MarkupError, parse_markup, restore_markup
from mtrain.decode.requests.request import DecodeRequest
from mtrain.decode.requests.terminology import Glossary
from mtrain.decode.search.hypothesis import Hypothesis
from mtrain.decode.search.placement import sentence_end_count
from mtrain.decode.translation.alignment import word_indices
from mtrain.decode.translation.confidence import Confidence
from mtrain.decode.translation.translator import translate_encoded
from mtrain.decoding_rules import Asked, TermUse, check_decoding, check_term_mode
from mtrain.errors import MtrainError
from mtrain.source_factors import TERM_TARGET, split_ids
from mtrain.tokenizer import Tokenizer
from mtrain.tokenizer.term_factors import annotate

log = logging.getLogger("mtrain.decode")


@dataclass(frozen=True)
class FieldNames:
    """How a refusal names what was asked: a request's fields (the default), or the command
    line's keys with their values (`terms=glossary.tsv`)."""

    prefix: str = "prefix"
    constraints: str = "constraints"
    terms: str = "terms"
    avoid: str = "avoid"
    format: str = "format"
    alignment: str = "alignment"
    pictures: str = "attention"


@dataclass(frozen=True)
class Options:
    """What a request asks of all its sentences."""

    decode: DecodeConfig  # beam, nbest, selection; `aligns`: word alignments in the results
    format: str = "text"  # text | xml | html: inline tags out, and back by word alignments
    tgt_lang: str | None = None  # a multilingual model's target language (None: its one)
    glossary: Glossary | None = None  # terms found in a sentence become constraints of it
    attention_layer: int | str | None = None  # cross-attention kept for pictures (translate)
    names: FieldNames = FieldNames()
    confidence: Confidence | None = None  # the run's: each hypothesis gets its score (None: not asked)

    def decoding(self) -> DecodeConfig:
        """The settings decoded with: word alignments added where markup needs them."""
        if self.format != "text" and not self.decode.aligns:
            return replace(self.decode, alignment="word")
        return self.decode


@dataclass
class PipelineStats:
    """What the controls did: constraints (from the input or a request) and glossary terms,
    how many were applied, in how many sentences, and how many the best translation holds."""

    sentences: int = 0
    constraints_applied: int = 0
    constraints_met: int = 0
    constrained_sentences: int = 0
    terms_applied: int = 0
    terms_met: int = 0
    termed_sentences: int = 0

    def summary(self) -> str | None:
        """One line for the end of a run; None when no constraint or term was applied."""
        parts = []
        if self.constraints_applied:
            parts.append(
                f"constraints: {self.constraints_applied} applied in {self.constrained_sentences} of "
                f"{self.sentences} sentences, {self.constraints_met} met"
            )
        if self.terms_applied:
            parts.append(
                f"terms: {self.terms_applied} found in {self.termed_sentences} of {self.sentences} sentences, "
                f"{self.terms_met} met"
            )
        return "; ".join(parts) or None

    def count(self, sentence: DecodeRequest, translation: str) -> None:
        """One sentence and its best translation (without tags): a phrase is met where the
        translation holds it as written (spaces inside it matching any whitespace)."""
        self.sentences += 1
        words = " " + " ".join(translation.split()) + " "
        terms = set(sentence.terms)
        given = [phrase for phrase in sentence.constraints if phrase not in terms]
        if given:
            self.constrained_sentences += 1
            self.constraints_applied += len(given)
            self.constraints_met += sum(" ".join(phrase.split()) in words for phrase in given)
        if sentence.terms:
            self.termed_sentences += 1
            self.terms_applied += len(sentence.terms)
            self.terms_met += sum(" ".join(phrase.split()) in words for phrase in sentence.terms)


def reads_terms(model: Any) -> bool:
    """Whether `model` (mtrain's model, an ensemble or an engine) reads terms in its source."""
    members = getattr(model, "members", None)
    if members is not None:
        return all(reads_terms(member) for member in members)
    for wrapped in ("engine", "model"):  # a selecting engine's engine, a torch engine's model
        if hasattr(model, wrapped) and not hasattr(model, "src_embed"):
            return reads_terms(getattr(model, wrapped))
    embed = getattr(model, "src_embed", None)
    return embed is not None and getattr(embed, "factors", None) is not None


def asked_of(requests: Sequence[DecodeRequest], options: Options) -> Asked:
    """What `requests` ask for beyond the decode settings, by `options.names`."""
    names = options.names
    constraints = any(r.constraints for r in requests)
    return Asked(
        prefix=names.prefix if any(r.prefix.strip() for r in requests) else None,
        constraints=names.constraints if constraints else names.terms if options.glossary is not None else None,
        avoid=names.avoid if any(r.avoid for r in requests) else None,
        markup=names.format if options.format != "text" else None,
        alignment=names.alignment if options.decode.aligns else None,
        pictures=names.pictures if options.attention_layer is not None else None,
    )


def check_requests(
    requests: Sequence[DecodeRequest], options: Options, ctranslate2: bool, term_aware: bool = False
) -> None:
    """1. RefusedCombination (mtrain.decoding_rules) for what cannot be honoured together on
    this engine (`ctranslate2`: CTranslate2's, else mtrain's own), and for terms asked as
    annotation of a model that is not `term_aware`."""
    check_decoding(options.decode, asked_of(requests, options), ctranslate2)
    check_term_mode(options.decode, options.glossary is not None, term_aware)


def prepare_requests(
    requests: Sequence[DecodeRequest], options: Options, term_aware: bool = False
) -> list[DecodeRequest]:
    """2. Each request with its plain text and controls: markup taken out, the glossary's terms
    found in the plain text (constraints unless `decode.term_mode` writes them into the source
    of a `term_aware` model only); MtrainError naming `where` for malformed markup."""
    constrain_terms = TermUse.of(options.decode.term_mode, term_aware).constrain
    prepared = []
    for request in requests:
        markup = None
        source = request.text
        if options.format != "text":
            try:
                markup = parse_markup(request.text.rstrip("\n"), options.format)
            except MarkupError as error:
                raise MtrainError(f"{request.where}: format={options.format}: {error}") from None
            source = markup.text
        terms: tuple[str, ...] = ()
        term_words: dict[str, list[int]] = {}
        constraints, avoid = request.constraints, request.avoid
        if options.glossary is not None:
            term_words = options.glossary.term_words(source)
            terms = tuple(term_words)
            if constrain_terms:
                constraints = tuple(dict.fromkeys([*constraints, *terms]))
            if options.decode.term_avoid_replaced:  # the glossary's third field: words a term replaces
                replaced = options.glossary.replaced_in(source)
                avoid = tuple(dict.fromkeys([*avoid, *(word for words in replaced.values() for word in words)]))
        prepared.append(
            replace(
                request,
                constraints=constraints,
                avoid=avoid,
                source=source,
                markup=markup,
                terms=terms,
                term_words=term_words,
            )
        )
    return prepared


def finish_requests(
    sentences: Sequence[DecodeRequest],
    hypotheses: list[list[Hypothesis]],
    options: Options,
    stats: PipelineStats | None = None,
) -> None:
    """4. In place: the stats counted (on the translations without their tags), each
    hypothesis' text with its sentence's tags put back, its links dropped unless
    `options.decode` asked for them; with `options.confidence`, its confidence score (a
    sentence not decoded, blank or its prefix alone, has none: its log-probability is 0)."""
    keep_links = options.decode.aligns
    confidence = options.confidence
    for sentence, hyps in zip(sentences, hypotheses, strict=True):
        if confidence is not None and sentence.ids is not None:
            for hyp in hyps:
                hyp.confidence = confidence.of(hyp)
        if stats is not None:
            stats.count(sentence, hyps[0].text if hyps else "")
        if sentence.markup is not None:
            for hyp in hyps:
                hyp.text = restore_markup(sentence.markup, hyp.text, hyp.alignment or [])
                if not keep_links:
                    hyp.alignment = None


@dataclass
class Translation:
    """One request's sentences between `begin_translation` (checked, prepared) and `finish`:
    the caller decodes `requests` (each with what `prepare` found) with `options.decoding()`."""

    requests: list[DecodeRequest]
    options: Options
    stats: PipelineStats | None = None

    def finish(self, hypotheses: list[list[Hypothesis]]) -> list[list[Hypothesis]]:
        """4. The decoded `hypotheses` (per request) finished in place (`finish_requests`), and returned."""
        finish_requests(self.requests, hypotheses, self.options, self.stats)
        return hypotheses


def begin_translation(
    requests: Sequence[DecodeRequest],
    options: Options,
    ctranslate2: bool,
    term_aware: bool = False,
    stats: PipelineStats | None = None,
    check: Callable[[DecodeConfig], None] | None = None,
) -> Translation:
    """1. `check_requests` (and the caller's own `check` of the settings decoded with: serve's
    decoder layers), then 2. `prepare_requests`: the request ready to decode; `stats` counts
    what its controls did when it finishes."""
    check_requests(requests, options, ctranslate2, term_aware)
    if check is not None:
        check(options.decoding())
    return Translation(prepare_requests(requests, options, term_aware), options, stats)


class RequestPipeline:
    """Requests in, hypotheses out (see the module's docstring), for one opened engine: the
    steps above around its decoder (`decode`)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Tokenizer,
        device: torch.device | str,
        precision: Precision | str = Precision.fp32,
        *,
        ctranslate2: bool = False,
        input_limit: int | None = None,
        tokenizers: dict[str, Tokenizer] | None = None,
    ) -> None:
        """`model`: mtrain's model, an ensemble or an engine (wrapped once: a bf16 engine casts
        its weights once). `input_limit`: source ids per sentence, eos included (None: no cut).
        `tokenizers`: per target language, its tokenizer (its tag first in every source)."""
        self.engine: Engine = as_engine(model, tokenizer, device, precision)
        self.model = model
        self.tokenizer = tokenizer
        self.tokenizers = tokenizers or {}
        self.device = device
        self.precision = precision
        self.ctranslate2 = ctranslate2
        self.input_limit = input_limit
        self.stats = PipelineStats()
        self.term_aware = reads_terms(model)  # its source embedding reads term factors
        self._phrase_encoders: dict[int, PhraseEncoder] = {}
        self._term_pieces: dict[tuple[int, str], list[int]] = {}  # (tokenizer, term) -> its source pieces

    def tokenizer_for(self, tgt_lang: str | None) -> Tokenizer:
        return self.tokenizers.get(tgt_lang, self.tokenizer) if tgt_lang is not None else self.tokenizer

    def begin(self, requests: Sequence[DecodeRequest], options: Options) -> Translation:
        """`begin_translation` on this engine, its stats counting."""
        return begin_translation(requests, options, self.ctranslate2, self.term_aware, self.stats)

    def decode(
        self,
        sentences: Sequence[DecodeRequest],
        decode: DecodeConfig,
        tgt_lang: str | None = None,
        attention_layer: int | str | None = None,
        on_batch: Callable[[int], object] | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> list[list[Hypothesis]]:
        """3. Per prepared request, up to `decode.nbest` hypotheses (with `.text`), decoded
        with `decode` as given (`Options.decoding()`: alignments for markup); each sentence's
        `ids` and `cut` filled. `stop()`: True ends the decode (DecodeStopped; the server's
        deadline), asked at every step."""
        tokenizer = self.tokenizer_for(tgt_lang)
        annotate = self.term_aware and TermUse.of(decode.term_mode, True).annotate
        for sentence in sentences:
            sentence.ids, sentence.cut = self.encode(sentence.plain, tokenizer, sentence.where)
            if annotate and sentence.ids and sentence.term_words:
                sentence.ids = self.annotated(sentence.ids, sentence.term_words, tokenizer)
        controls = None
        if any(sentence.controlled for sentence in sentences):
            encode = self._phrase_encoders.get(id(tokenizer))
            if encode is None:
                encode = self._phrase_encoders[id(tokenizer)] = phrase_encoder(tokenizer, self.model)
            controls = [
                encode_request(
                    tokenizer,
                    sentence if sentence.controlled else None,
                    encode,
                    term_sources(tokenizer, sentence.ids, sentence.term_words),
                    sentence_end_count(sentence.plain),
                )
                for sentence in sentences
            ]
        return translate_encoded(
            self.engine,
            tokenizer,
            [sentence.ids for sentence in sentences],
            decode,
            self.device,
            self.precision,
            attention_layer=attention_layer,
            on_batch=on_batch,
            controls=controls,
            stop=stop,
        )

    def encode(self, text: str, tokenizer: Tokenizer, where: str = "") -> tuple[list[int] | None, bool]:
        """Source ids with eos (None for a blank sentence), cut to the input limit with a
        warning; and whether it was cut."""
        if not text.strip():
            return None, False
        try:
            ids = tokenizer.encode_src(text)
        except Exception as error:  # the request's sentence, not the program, is at fault
            raise MtrainError(
                f"{where or 'text'}: a sentence the tokenizer cannot encode ({type(error).__name__}); "
                "send valid Unicode text"
            ) from error
        limit = self.input_limit
        if limit is not None and len(ids) + 1 > limit:
            log.warning(
                "%s: %d subword tokens; truncated to the first %d (max_input_tokens=%d incl. eos)",
                where or "a sentence",
                len(ids),
                limit - 1,
                limit,
            )
            return ids[: limit - 1] + [tokenizer.eos_id], True
        return ids + [tokenizer.eos_id], False

    def annotated(self, ids: list[int], term_words: dict[str, list[int]], tokenizer: Tokenizer) -> list[int]:
        """Source `ids` (eos last) with each term written after its source words, as the
        model was trained to read them; the plain ids where that would pass the input limit."""
        prefix = len(tokenizer.source_prefix)
        word_of = [-1] * prefix + word_indices(tokenizer.src_pieces(ids[prefix:-1])) + [-1]
        terms = []
        for target, words in term_words.items():
            pieces = self._term_pieces.get((id(tokenizer), target))
            if pieces is None:
                pieces = self._term_pieces[id(tokenizer), target] = tokenizer.encode_src(target)[prefix:]
            terms.append((words, pieces))
        annotated = annotate(ids, word_of, terms, tokenizer.src_vocab_size)
        if self.input_limit is not None and len(annotated) > self.input_limit:
            return ids
        return annotated

    def translate(
        self,
        requests: Sequence[DecodeRequest],
        options: Options,
        on_batch: Callable[[int], object] | None = None,
    ) -> list[list[Hypothesis]]:
        """Per request, up to `options.decode.nbest` hypotheses: checked, prepared, decoded, finished."""
        translation = self.begin(requests, options)
        decoded = self.decode(
            translation.requests, options.decoding(), options.tgt_lang, options.attention_layer, on_batch
        )
        return translation.finish(decoded)


def term_sources(
    tokenizer: Tokenizer, ids: Sequence[int] | None, term_words: dict[str, list[int]]
) -> dict[str, tuple[int, ...]]:
    """Per target term, the positions in `ids` (a source as encoded: a tag first, eos last) of
    the pieces of its source words, and of the term written after them in a term-aware
    model's source (term placement, mtrain.decode.search.placement)."""
    if not ids or not term_words:
        return {}
    offset = len(tokenizer.source_prefix)
    # An annotated source (a term-aware model's): its source pieces are those of no term.
    pieces, factors = split_ids(ids, tokenizer.src_vocab_size)
    plain = [k for k, factor in enumerate(factors) if factor != TERM_TARGET]
    word_of = word_indices(tokenizer.src_pieces([pieces[k] for k in plain[offset:-1]]))
    found = {}
    for target, words in term_words.items():
        wanted = set(words)
        positions = [plain[offset + i] for i, word in enumerate(word_of) if word in wanted]
        # and the term written after them: the model reads the word and its term as one
        after = positions[-1] + 1 if positions else len(factors)
        while after < len(factors) and factors[after] == TERM_TARGET:
            positions.append(after)
            after += 1
        found[target] = tuple(positions)
    return found


def with_options(decode: DecodeConfig, **values: Any) -> DecodeConfig:
    """`decode` (a dataclass, or a composed node) as the dataclass with `values` changed."""
    typed: DecodeConfig = to_typed(decode)
    return replace(typed, **values) if values else typed
