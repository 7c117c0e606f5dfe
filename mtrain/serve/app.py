"""The HTTP face of `mtrain serve`: routes, request checks and JSON errors (FastAPI).

    GET  /health     {"status": "ok", "model": ..., "batches": N, ...}
    POST /translate  {"text": ["...", ...], "beam": 5, "nbest": 1, "tgt_lang": "en",
                      "alignment": true, "format": "text|xml|html"}
                  -> {"translations": ["...", ...], "scores": [...]}   (+ "nbest" when nbest > 1,
                     + "alignments": ["0-0 1-2", ...] with alignment, "expected_utilities" with
                     MBR decoding, "rerank_scores" with reranking)
    optional, per sentence of text: "prefix": ["A man", null], "constraints": [["dog"], []];
    for all of them: "avoid": ["phrase", ...]   (docs/SERVE.md, mtrain.decode.controls)

Every answer is JSON, errors too: `{"error": "<field or limit key>: <what is wrong>"}` with a
4xx status (400 a body that is not JSON, 408 one that came too slowly, 413 over a size
limit, 422 a wrong field, type or value, 404/405 no such route), 504 past
`request_timeout_s`, 503 while shutting down or over `max_connections`, and a 500 that
names only the exception type, never a traceback. The body is read, within its limits, before
a route sees it (`serve.protocol`). A /translate body is JSON whatever its Content-Type says,
checked here (`read_translate_request`) so that every message is ours and names the field.
Handlers never decode: they submit the request's sentences to the batcher
(`mtrain.serve.batcher`), whose one worker thread decodes the sentences of concurrent
requests together, and await the result; a request whose sentence fails to encode or decode
fails alone, never the requests that shared its batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import difflib
import json
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from mtrain.config import (
    AlignmentLevel,
    DecodeConfig,
    MbrCandidates,
    Sampling,
    ServeConfig,
    alignment_level,
    with_values,
)
from mtrain.decode.alignment import pharaoh
from mtrain.decode.constraints import CONSTRAINTS_REFUSED
from mtrain.decode.controls import TargetRequest
from mtrain.decode.markup import Markup, MarkupError, parse_markup, restore_markup
from mtrain.decoding_rules import SELECTION_WITH_ALIGNMENT, SELECTION_WITH_CONTROLS
from mtrain.errors import MtrainError
from mtrain.serve.access import add_access_control
from mtrain.serve.batcher import Batcher, BatcherClosed
from mtrain.serve.libretranslate import LIBRETRANSLATE_PATH, add_libretranslate
from mtrain.serve.model import ServedModel, UnknownTargetLanguage, check_target_language
from mtrain.serve.page import page_router
from mtrain.serve.protocol import RequestBody, RequestLog, printable

log = logging.getLogger("mtrain.serve")


class TranslateRequest(BaseModel):
    """The body of POST /translate. Strict: "5" is not a beam, "a" is not a list of sentences."""

    model_config = ConfigDict(extra="forbid", strict=True)

    text: list[str]
    beam: int | None = None  # default: the server's decode.beam
    nbest: int | None = None  # default: the server's decode.nbest
    tgt_lang: str | None = None  # one of the model's target languages; null: its one (not for a multilingual model)
    prefix: list[str | None] | None = None  # per sentence, what its translation starts with (null: nothing)
    constraints: list[list[str]] | None = None  # per sentence, phrases its translation must contain
    avoid: list[str] | None = None  # phrases no translation of the request may contain
    alignment: bool | None = None  # word alignments in the answer; default: the server's decode.alignment
    format: str = "text"  # text | xml | html: inline tags taken out and put back (mtrain.decode.markup)


# What each field must be, in the words of an error message.
FIELDS = {
    "text": "a list of sentences (strings)",
    "beam": "a whole number",
    "nbest": "a whole number",
    "tgt_lang": "a language (a string) or null",
    "prefix": "a list with a string (or null) per sentence of text",
    "constraints": "a list with a list of phrases (strings) per sentence of text",
    "avoid": "a list of phrases (strings)",
    "alignment": "true, false or null",
    "format": "text, xml or html",
}
# What an item of a list field must be.
PHRASE = "a phrase (a string)"
ITEMS = {
    "text": "a string (a sentence)",
    "prefix": "a string or null",
    "constraints": "a list of phrases (strings)",
    "avoid": PHRASE,
}
MAX_PHRASES = 32  # constraints per sentence, and avoided phrases per request (each costs search work)


@dataclasses.dataclass(frozen=True)
class ControlledSentence:
    """A sentence of a request that asks for a prefix, constraints or avoided phrases."""

    text: str
    request: TargetRequest


Sentence = str | ControlledSentence  # what the batcher queues (LibreTranslate's sentences are plain)


@dataclasses.dataclass(frozen=True)
class Setting:
    """What a batch decodes with: requests share a batch when these are equal."""

    decode: DecodeConfig
    tgt_lang: str | None  # resolved by check_target_language (None: the model does not say)


def setting_key(setting: Setting) -> tuple:
    return dataclasses.astuple(setting.decode), setting.tgt_lang


class Rejected(Exception):
    """A request refused with `status` and a one-line reason naming the field or limit."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def error_response(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def build_app(model: ServedModel, cfg: ServeConfig) -> FastAPI:
    """The service for `model` with `cfg`'s limits; its batcher lives as long as the app runs
    (started and drained by the app's lifespan)."""
    state: dict[str, Any] = {"batcher": None, "started": time.time()}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        def decode(sentences: list[Sentence], setting: Setting) -> list[Any]:
            texts = [s.text if isinstance(s, ControlledSentence) else s for s in sentences]
            if not any(isinstance(s, ControlledSentence) for s in sentences):
                return model.translate(texts, setting.decode, setting.tgt_lang)
            requests = [s.request if isinstance(s, ControlledSentence) else None for s in sentences]
            return model.translate(texts, setting.decode, setting.tgt_lang, requests)

        state["batcher"] = Batcher(
            decode, cfg.max_batch_sentences, cfg.max_wait_ms / 1000.0, key=setting_key, name="mtrain-decoder"
        )
        yield
        # uvicorn has already answered every request in flight: what is left is queued work of none.
        state["batcher"].close(timeout=cfg.request_timeout_s)
        log.info("stopped after %d batches", state["batcher"].stats().batches)

    app = FastAPI(title="mtrain serve", docs_url=None, redoc_url=None, lifespan=lifespan)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, error: StarletteHTTPException) -> JSONResponse:
        return error_response(error.status_code, str(error.detail))

    @app.exception_handler(Rejected)
    async def rejected(_request: Request, error: Rejected) -> JSONResponse:
        return error_response(error.status, str(error))

    @app.exception_handler(Exception)
    async def internal_error(_request: Request, error: Exception) -> JSONResponse:
        # uvicorn logs the traceback (the exception goes on past this answer); the client gets one line.
        return error_response(500, f"internal error ({type(error).__name__}); the server's log has the details")

    @app.get("/health")
    async def health() -> dict:
        return health_body(model, cfg, state["batcher"], state["started"])

    @app.post("/translate", openapi_extra=TRANSLATE_BODY)
    async def translate(request: Request) -> dict:
        body = read_translate_request(await request.body())
        request.state.sentences = len(body.text)
        try:
            tgt_lang = check_target_language(body.tgt_lang, model.target_languages())
        except UnknownTargetLanguage as error:
            raise Rejected(422, str(error)) from None
        check_text(body.text, cfg)
        decode = request_decoding(body, cfg)
        markups = request_markup(body)
        if markups is not None:  # the sentences without their tags, whose words the controls see
            body = body.model_copy(update={"text": [markup.text for markup in markups]})
        sentences = controlled_sentences(body, cfg, model.engine_name)
        hypotheses = await translated(state["batcher"], sentences, Setting(decode, tgt_lang), cfg.request_timeout_s)
        if markups is not None:
            for markup, hyps in zip(markups, hypotheses, strict=True):
                for hyp in hyps:
                    hyp.text = restore_markup(markup, hyp.text, hyp.alignment or [])
        return response_body(hypotheses, decode.nbest, alignments=wants_alignment(body, cfg))

    # The web page, LibreTranslate's API beside mtrain's, who may translate (serve.page, .libretranslate, .access).
    app.include_router(page_router())
    add_access_control(app, cfg, paths=("/translate", LIBRETRANSLATE_PATH))
    add_libretranslate(app, model, cfg, lambda text, decode, lang: state["batcher"].submit(text, Setting(decode, lang)))
    app.add_middleware(RequestBody, max_bytes=cfg.max_request_bytes, read_timeout_s=cfg.read_timeout_s)
    if cfg.access_log:
        app.add_middleware(RequestLog)  # added last: the outermost, it logs what RequestBody refuses too
    return app


# FastAPI documents a body it parses itself; /translate reads its own (read_translate_request).
TRANSLATE_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": TranslateRequest.model_json_schema()}},
    }
}


def health_body(model: ServedModel, cfg: ServeConfig, batcher: Batcher, started: float) -> dict:
    """What GET /health answers: the model (named without a path), its settings, the work done."""
    stats = batcher.stats()
    return {
        "status": "ok",
        "model": model.name,
        "engine": model.engine_name,
        "device": str(model.device),
        "precision": model.precision,
        "threads": model.threads,
        "src_lang": model.src_lang,
        "tgt_lang": model.tgt_lang,
        "target_languages": model.target_languages(),
        "decode": {"beam": cfg.decode.beam, "nbest": cfg.decode.nbest},
        "requests": stats.requests,
        "batches": stats.batches,
        "sentences": stats.items,
        "largest_batch": stats.largest_batch,
        "queued_sentences": stats.waiting_items,
        "uptime_s": round(time.time() - started, 3),
        "limits": {
            key: getattr(cfg, key)
            for key in (
                "max_batch_sentences",
                "max_wait_ms",
                "max_request_bytes",
                "max_sentences",
                "max_sentence_chars",
                "request_timeout_s",
                "max_beam",
                "max_input_tokens",
            )
        },
    }


async def translated(batcher: Batcher, sentences: Sequence[Sentence], setting: Setting, timeout_s: float) -> list[Any]:
    """The batcher's hypotheses for `sentences`, or Rejected: 503 shutting down, 504 past
    `timeout_s`, 422 for an MtrainError (a sentence the model cannot take)."""
    try:
        future = batcher.submit(sentences, setting)
    except BatcherClosed:
        raise Rejected(503, "the server is shutting down; retry on another instance") from None
    try:
        return await asyncio.wait_for(asyncio.wrap_future(future), timeout_s)
    except asyncio.TimeoutError:
        future.cancel()  # its sentences leave the queue if they are not decoding yet
        raise Rejected(
            504, f"request_timeout_s: not translated within {timeout_s:g} s; retry later or send fewer sentences"
        ) from None
    except MtrainError as error:
        raise Rejected(422, str(error)) from None


def read_translate_request(raw: bytes) -> TranslateRequest:
    """The request `raw` holds, as JSON whatever the Content-Type: Rejected 400 for a body that
    is not JSON, 422 naming the field for a wrong field, type or value."""
    try:
        value = json.loads(raw)
    except RecursionError:
        raise Rejected(400, "body: malformed JSON (nested too deeply)") from None
    except ValueError as error:  # JSONDecodeError, or bytes that are not UTF-8
        reason = "an empty body" if not raw.strip() else printable(str(error))
        raise Rejected(
            400, f'body: malformed JSON ({reason}); send a JSON object such as {{"text": ["..."]}}'
        ) from None
    try:
        return TranslateRequest.model_validate(value)
    except ValidationError as error:
        raise Rejected(422, describe_validation_error(error.errors())) from None


def describe_validation_error(errors: Sequence[Any]) -> str:
    """One line, in our words, for pydantic's errors about a /translate body: an unknown field
    first (a misspelt name explains the "missing" one), else the first error."""
    unknown = [error for error in errors if error["type"] == "extra_forbidden"]
    first = unknown[0] if unknown else errors[0]
    loc, kind, given = tuple(first["loc"]), first["type"], first.get("input")
    fields = ", ".join(FIELDS)
    if kind == "string_unicode":  # a field's name holds a lone surrogate (pydantic gives no place)
        return f"body: the field name {printable(str(given))} is not Unicode text (a lone UTF-16 surrogate)"
    if not loc:
        return f'body: must be a JSON object such as {{"text": ["..."]}}, not {json_kind(given)}'
    field = printable(str(loc[0])) + "".join(f"[{part}]" for part in loc[1:])
    if kind == "extra_forbidden":
        guess = difflib.get_close_matches(str(loc[0]), list(FIELDS), n=1)
        hint = f'; did you mean "{guess[0]}"?' if guess else ""
        return f"{field}: not a field of this request{hint} (the fields: {fields})"
    if kind == "missing":
        return f'{field}: missing; send the sentences as "text": ["...", ...]'
    if len(loc) > 1:  # text[i], prefix[i], constraints[i] or constraints[i][j], avoid[i]
        indices = [part for part in loc[1:] if isinstance(part, int)]
        field = printable(str(loc[0])) + "".join(f"[{index}]" for index in indices)
        item = PHRASE if len(indices) > 1 else ITEMS.get(str(loc[0]), "valid")
        return f"{field}: must be {item}, not {json_kind(given)}"
    if loc[0] in FIELDS:
        return f"{field}: must be {FIELDS[loc[0]]}, not {json_kind(given)}"
    return f"{field}: {first.get('msg', 'invalid')}"


def json_kind(value: Any) -> str:
    """What a JSON value is, in words: a string, a number, an object, ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    kinds = ((str, "a string"), (int, "a number"), (float, "a number"), (list, "a list"), (dict, "an object"))
    return next((name for kind, name in kinds if isinstance(value, kind)), type(value).__name__)


def check_text(sentences: list[str], cfg: ServeConfig) -> None:
    """Rejected unless the request's sentences are within the size limits (413) and are Unicode
    text (422: JSON can carry a lone UTF-16 surrogate, "\\ud800", which no tokenizer takes)."""
    if len(sentences) > cfg.max_sentences:
        raise Rejected(
            413,
            f"max_sentences: {len(sentences)} sentences in one request, the limit is "
            f"{cfg.max_sentences}; split the request",
        )
    for index, sentence in enumerate(sentences):
        if len(sentence) > cfg.max_sentence_chars:
            raise Rejected(
                413,
                f"max_sentence_chars: text[{index}] has {len(sentence)} characters, the limit is "
                f"{cfg.max_sentence_chars}",
            )
        try:
            sentence.encode("utf-8")
        except UnicodeEncodeError as error:
            raise Rejected(
                422,
                f"text[{index}]: character {error.start} is a lone UTF-16 surrogate "
                f"({printable(sentence[error.start])}), not text; send valid Unicode (a surrogate pair, or UTF-8)",
            ) from None


def controlled_sentences(request: TranslateRequest, cfg: ServeConfig, engine: str) -> list[Sentence]:
    """The request's sentences with their prefixes, constraints and avoided phrases; Rejected
    (422) for lists that do not match `text`, too many phrases, or what the engine or the
    server's search cannot honour (CTranslate2 and sampling have no constraints)."""
    count = len(request.text)
    for key in ("prefix", "constraints"):
        given = getattr(request, key)
        if given is not None and len(given) != count:
            raise Rejected(
                422, f"{key}: {len(given)} entries for {count} sentences in text; give one per sentence (in order)"
            )
    for key, phrases in [("avoid", request.avoid or [])] + [
        (f"constraints[{i}]", sentence) for i, sentence in enumerate(request.constraints or [])
    ]:
        if len(phrases) > MAX_PHRASES:
            raise Rejected(422, f"{key}: {len(phrases)} phrases, at most {MAX_PHRASES}")
        for phrase in phrases:
            if len(phrase) > cfg.max_sentence_chars:
                raise Rejected(413, f"max_sentence_chars: a phrase of {key} has {len(phrase)} characters")
    if any(request.constraints or []):
        if engine != "torch":
            raise Rejected(422, f"constraints: {CONSTRAINTS_REFUSED}")
        if cfg.decode.sampling != Sampling.none:
            raise Rejected(422, "constraints: lexical constraints need beam search; this server samples")
    if request.prefix is None and request.constraints is None and not request.avoid:
        return list(request.text)
    if cfg.decode.selects:
        field = next(key for key in ("prefix", "constraints", "avoid") if getattr(request, key) is not None)
        raise Rejected(422, f"{field}: {SELECTION_WITH_CONTROLS}")
    prefixes = request.prefix or [None] * count
    constraints = request.constraints or [[] for _ in range(count)]
    avoid = tuple(request.avoid or ())
    return [
        ControlledSentence(text, TargetRequest(prefix or "", tuple(phrases), avoid))
        for text, prefix, phrases in zip(request.text, prefixes, constraints, strict=True)
    ]


def wants_alignment(request: TranslateRequest, cfg: ServeConfig) -> bool:
    """Whether the answer carries word alignments: the request's `alignment`, else the server's."""
    if request.alignment is not None:
        return request.alignment
    return alignment_level(cfg.decode.alignment) is not AlignmentLevel.none


def request_markup(request: TranslateRequest) -> list[Markup] | None:
    """The sentences' text and tags with `format` xml|html (None for text); Rejected 422
    naming the sentence whose markup is malformed."""
    if request.format == "text":
        return None
    if request.format not in ("xml", "html"):
        raise Rejected(422, f"format: {printable(request.format)} must be text, xml or html")
    markups = []
    for index, sentence in enumerate(request.text):
        try:
            markups.append(parse_markup(sentence, request.format))
        except MarkupError as error:
            raise Rejected(422, f"text[{index}]: format={request.format}: {error}") from None
    return markups


def request_decoding(request: TranslateRequest, cfg: ServeConfig) -> DecodeConfig:
    """The server's decode settings with the request's beam and nbest; word alignments when
    the request asks for them or for markup (which is put back by them)."""
    beam = cfg.decode.beam if request.beam is None else request.beam
    nbest = cfg.decode.nbest if request.nbest is None else request.nbest
    for key, value in (("beam", beam), ("nbest", nbest)):
        if not 1 <= value <= cfg.max_beam:
            raise Rejected(422, f"{key}: {value} is outside 1..{cfg.max_beam} (max_beam={cfg.max_beam})")
    if cfg.decode.mbr.candidates != MbrCandidates.none:
        if nbest > cfg.decode.mbr.num_candidates:
            raise Rejected(
                422,
                f"nbest: {nbest} is above decode.mbr.num_candidates={cfg.decode.mbr.num_candidates} (MBR ranks its candidates)",
            )
    elif nbest > beam and cfg.decode.sampling == Sampling.none:
        raise Rejected(422, f"nbest: {nbest} is above beam={beam} (beam search keeps only `beam` hypotheses)")
    alignment = cfg.decode.alignment
    if request.alignment is not None:
        alignment = "word" if request.alignment else "false"
    if request.format != "text" and alignment_level(alignment) is AlignmentLevel.none:
        alignment = "word"
    if request.format != "text" and alignment_level(alignment) is AlignmentLevel.subword:
        raise Rejected(422, "format: markup is put back by word alignments; the server aligns subwords")
    if alignment_level(alignment) is not AlignmentLevel.none and cfg.decode.uses_mbr:
        raise Rejected(422, f"{'alignment' if request.format == 'text' else 'format'}: {SELECTION_WITH_ALIGNMENT}")
    return with_values(cfg.decode, beam=beam, nbest=nbest, alignment=alignment)


def response_body(hypotheses: list[list[Any]], nbest: int, alignments: bool = False) -> dict:
    """translations and scores (and alignments: Pharaoh `i-j` strings) of the best
    hypotheses; with nbest > 1, every hypothesis under "nbest"."""
    body: dict[str, Any] = {
        "translations": [hyps[0].text for hyps in hypotheses],
        "scores": [hyps[0].score for hyps in hypotheses],
    }
    if alignments:
        body["alignments"] = [pharaoh(hyps[0].alignment or []) for hyps in hypotheses]
    # MBR decoding's expected utility (a confidence score) and reranking's score, when decoded with them.
    plural = {"expected_utility": "expected_utilities", "rerank_score": "rerank_scores"}
    extras = [key for key in plural if any(getattr(hyps[0], key) is not None for hyps in hypotheses)]
    for key in extras:
        body[plural[key]] = [getattr(hyps[0], key) for hyps in hypotheses]
    if nbest > 1:
        body["nbest"] = [
            [
                {
                    "text": hyp.text,
                    "score": hyp.score,
                    **({"alignment": pharaoh(hyp.alignment or [])} if alignments else {}),
                    **{key: getattr(hyp, key) for key in extras},
                }
                for hyp in hyps
            ]
            for hyps in hypotheses
        ]
    return body
