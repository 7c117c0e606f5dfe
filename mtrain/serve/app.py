"""The HTTP face of `mtrain serve`: routes, request checks and JSON errors (FastAPI).

    GET  /health     {"status": "ok", "model": ..., "batches": N, ...}
    POST /translate  {"text": ["...", ...], "beam": 5, "nbest": 1, "tgt_lang": "en",
                      "alignment": true, "format": "text|xml|html"}
                  -> {"translations": ["...", ...], "scores": [...]}   (+ "nbest" when nbest > 1,
                     + "alignments": ["0-0 1-2", ...] with alignment, "expected_utilities" with
                     MBR decoding, "rerank_scores" with reranking, "confidences": [0.71, null, ...]
                     with "confidence": true)
    optional, per sentence of text: "prefix": ["A man", null], "constraints": [["dog"], []];
    for all of them: "avoid": ["phrase", ...], "terms": [["Hund", "dog"], ...] (a glossary
    beside the server's `terms=FILE.tsv`, which every request gets)   (docs/SERVE.md)

A request goes the way `mtrain translate`'s lines go, through the request pipeline
(`mtrain.decode.requests.pipeline`): its fields become `DecodeRequest`s and `Options`, checked by the
same rules (`mtrain.decoding_rules`: 422 naming the field, in the words translate's one-line
error uses), markup taken out and terms found (`prepare_requests`), decoded in the batcher
(`ServedModel.translate`, the pipeline's decoder step), tags put back (`finish_requests`).
LibreTranslate's API (`libretranslate.py`) takes the same path.

Every answer is JSON, errors too: `{"error": "<field or limit key>: <what is wrong>"}` with a
4xx status (400 a body that is not JSON, 408 one that came too slowly, 413 over a size
limit, 422 a wrong field, type or value, 404/405 no such route), 504 past
`request_timeout_s`, 503 while shutting down or over `max_connections`, and a 500 that
names only the exception type, never a traceback. The body is read, within its limits, before
a route sees it (`serve.protocol`). A /translate body is JSON whatever its Content-Type says,
checked here (`read_translate_request`) so that every message is ours and names the field.
Handlers never decode: they submit the request's sentences to the batcher
(`mtrain.serve.batcher`), whose worker threads decode the sentences of concurrent requests
together (one for requests with constraints, one for the rest: `serve.translation.Lane`), and
await the result; a request whose sentence fails to encode or decode
fails alone, never the requests that shared its batch.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from mtrain.config import (
    DecodeConfig,
    ServeConfig,
)
from mtrain.decode.requests.pipeline import (
    Options,
    PipelineStats,
    with_options,
)
from mtrain.decode.requests.request import DecodeRequest
from mtrain.decode.requests.terminology import Glossary
from mtrain.decode.translation.alignment import pharaoh
from mtrain.decoding_rules import RefusedCombination, check_nbest
from mtrain.errors import MtrainError
from mtrain.serve.access import add_access_control
from mtrain.serve.batcher import Batcher
from mtrain.serve.guards import SecurityHeaders, add_browser_rules
from mtrain.serve.libretranslate import LIBRETRANSLATE_PATH, add_libretranslate
from mtrain.serve.model import ServedModel, UnknownTargetLanguage, check_target_language
from mtrain.serve.page import page_router
from mtrain.serve.protocol import RequestBody, RequestLog, printable
from mtrain.serve.translation import (
    Lane,
    Rejected,
    Served,
    Setting,
    check_controls_agree,
    lone_surrogate,
    served_confidence,
    server_glossary,
    setting_key,
)

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
    terms: list[list[str]] | None = None  # [source term, target term] pairs, beside the server's glossary
    alignment: bool | None = None  # word alignments in the answer; default: the server's decode.alignment
    format: str = "text"  # text | xml | html: inline tags taken out and put back (mtrain.decode.requests.markup)
    confidence: bool = False  # each translation's confidence score in [0, 1] (null: a blank sentence)


# What each field must be, in the words of an error message.
FIELDS = {
    "text": "a list of sentences (strings)",
    "beam": "a whole number",
    "nbest": "a whole number",
    "tgt_lang": "a language (a string) or null",
    "prefix": "a list with a string (or null) per sentence of text",
    "constraints": "a list with a list of phrases (strings) per sentence of text",
    "avoid": "a list of phrases (strings)",
    "terms": "a list of [source term, target term] pairs",
    "alignment": "true, false or null",
    "format": "text, xml or html",
    "confidence": "true or false",
}
# What an item of a list field must be.
PHRASE = "a phrase (a string)"
ITEMS = {
    "text": "a string (a sentence)",
    "prefix": "a string or null",
    "constraints": "a list of phrases (strings)",
    "avoid": PHRASE,
    "terms": "a [source term, target term] pair",
}
MAX_PHRASES = 32  # constraints per sentence, and avoided phrases per request (each costs search work)
MAX_TERMS = 256  # term pairs per request (a term costs search work only where its source term is found)


def error_response(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def build_app(model: ServedModel, cfg: ServeConfig, glossary: Glossary | None = None) -> FastAPI:
    """The service for `model` with `cfg`'s limits; its batcher lives as long as the app runs
    (started and drained by the app's lifespan). `glossary`: the server's `terms=` (None: read
    here when cfg.terms names one)."""
    state: dict[str, Any] = {"batcher": None, "started": time.time()}
    served = Served(model, cfg, glossary or server_glossary(cfg), PipelineStats(), served_confidence(cfg))
    log.info("confidence scores (to requests asking for them): %s", served.confidence.source)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        def decode(sentences: list[DecodeRequest], setting: Setting, stop: Callable[[], bool]) -> list[Any]:
            return model.translate(sentences, setting.decode, setting.tgt_lang, stop=stop)

        # Two lanes: constrained searches (Lane.constrained) never hold up plain requests.
        state["batcher"] = Batcher(
            decode,
            cfg.max_batch_sentences,
            cfg.max_wait_ms / 1000.0,
            key=setting_key,
            name="mtrain-decoder",
            lanes=len(Lane),
        )
        yield
        # uvicorn has already answered every request in flight: what is left is queued work of none.
        state["batcher"].close(timeout=cfg.request_timeout_s)
        log.info("stopped after %d batches", state["batcher"].stats().batches)
        if served.stats.summary():
            log.info("%s", served.stats.summary())

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
            tgt_lang = check_target_language(body.tgt_lang, model.target_languages(), model.tgt_lang)
        except UnknownTargetLanguage as error:
            raise Rejected(422, str(error)) from None
        check_text(body.text, cfg)
        requests, options = pipeline_request(body, served, tgt_lang)
        return await served.translate(state["batcher"], requests, options, response_body)

    # The web page, LibreTranslate's API beside mtrain's, who may translate (serve.page, .libretranslate, .access).
    app.include_router(page_router())
    add_access_control(app, cfg, paths=("/translate", LIBRETRANSLATE_PATH))
    add_libretranslate(app, served, lambda: state["batcher"])
    add_browser_rules(app, cfg)  # Host allow-list, CORS, the client's address behind trusted proxies (serve.guards)
    app.add_middleware(RequestBody, max_bytes=cfg.max_request_bytes, read_timeout_s=cfg.read_timeout_s)
    app.add_middleware(SecurityHeaders)  # on every answer, RequestBody's 408 and 413 too
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
                "max_sentence_constraints",
                "max_constrained_work",
                "max_input_tokens",
            )
        },
    }


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
        problem = lone_surrogate(f"text[{index}]", sentence)
        if problem is not None:
            raise Rejected(422, problem)


def pipeline_request(
    request: TranslateRequest, served: Served, tgt_lang: str | None = None
) -> tuple[list[DecodeRequest], Options]:
    """The body as the request pipeline's requests and options; Rejected (422, 413 for a
    phrase over max_sentence_chars) for lists that do not match `text`, too many phrases, a
    term that is not a pair, beam or nbest out of range."""
    cfg = served.cfg
    count = len(request.text)
    for key in ("prefix", "constraints"):
        given = getattr(request, key)
        if given is not None and len(given) != count:
            raise Rejected(
                422, f"{key}: {len(given)} entries for {count} sentences in text; give one per sentence (in order)"
            )
    limits: list[tuple[str, list[Any], int]] = [
        ("avoid", list(request.avoid or []), MAX_PHRASES),
        ("terms", list(request.terms or []), MAX_TERMS),
    ]
    limits += [(f"constraints[{i}]", sentence, MAX_PHRASES) for i, sentence in enumerate(request.constraints or [])]
    for key, phrases, most in limits:
        if len(phrases) > most:
            raise Rejected(422, f"{key}: {len(phrases)} {'pairs' if key == 'terms' else 'phrases'}, at most {most}")
    for index, pair in enumerate(request.terms or []):
        if len(pair) != 2 or not all(term.strip() for term in pair):
            raise Rejected(422, f"terms[{index}]: must be a [source term, target term] pair of non-blank strings")
    for key, phrases in [
        ("avoid", request.avoid or []),
        ("terms", [t for pair in request.terms or [] for t in pair]),
    ] + [(f"constraints[{i}]", sentence) for i, sentence in enumerate(request.constraints or [])]:
        for phrase in phrases:
            if len(phrase) > cfg.max_sentence_chars:
                raise Rejected(413, f"max_sentence_chars: a phrase of {key} has {len(phrase)} characters")
    for field, phrase in request_phrases(request):
        problem = lone_surrogate(field, phrase)
        if problem is not None:
            raise Rejected(422, problem)
    try:
        check_controls_agree(
            [(source, target) for source, target in request.terms or []],
            request.avoid or [],
            [
                (f"constraints[{i}][{j}]", c)
                for i, phrases in enumerate(request.constraints or [])
                for j, c in enumerate(phrases)
            ],
            cfg.terms_ignore_case,
        )
    except MtrainError as error:
        raise Rejected(400, str(error)) from None
    if request.format not in ("text", "xml", "html"):
        raise Rejected(422, f"format: {printable(request.format)} must be text, xml or html")
    prefixes = request.prefix or [None] * count
    constraints = request.constraints or [[] for _ in range(count)]
    avoid = tuple(request.avoid or ())
    requests = [
        DecodeRequest(text, prefix or "", tuple(phrases), avoid, where=f"text[{index}]")
        for index, (text, prefix, phrases) in enumerate(zip(request.text, prefixes, constraints, strict=True))
    ]
    pairs = [(source, target) for source, target in request.terms or []]
    options = Options(
        request_decoding(request, cfg),
        request.format,
        tgt_lang,
        served.glossary_with(pairs),
        confidence=served.confidence if request.confidence else None,
    )
    return requests, options


def request_phrases(request: TranslateRequest) -> list[tuple[str, str]]:
    """Every phrase of the request besides its text, each with the field that names it
    (`terms[2][1]`: the third pair's target term)."""
    named = [(f"prefix[{i}]", prefix) for i, prefix in enumerate(request.prefix or []) if prefix is not None]
    named += [
        (f"constraints[{i}][{j}]", phrase)
        for i, phrases in enumerate(request.constraints or [])
        for j, phrase in enumerate(phrases)
    ]
    named += [(f"avoid[{j}]", phrase) for j, phrase in enumerate(request.avoid or [])]
    named += [(f"terms[{i}][{k}]", term) for i, pair in enumerate(request.terms or []) for k, term in enumerate(pair)]
    return named


def request_decoding(request: TranslateRequest, cfg: ServeConfig) -> DecodeConfig:
    """The server's decode settings with the request's beam, nbest and alignment (what markup
    needs besides: `Options.decoding`; what combines with what: the pipeline's rules)."""
    beam = cfg.decode.beam if request.beam is None else request.beam
    nbest = cfg.decode.nbest if request.nbest is None else request.nbest
    for key, value in (("beam", beam), ("nbest", nbest)):
        if not 1 <= value <= cfg.max_beam:
            raise Rejected(422, f"{key}: {value} is outside 1..{cfg.max_beam} (max_beam={cfg.max_beam})")
    alignment = cfg.decode.alignment
    if request.alignment is not None:
        alignment = "word" if request.alignment else "false"
    decode = with_options(cfg.decode, beam=beam, nbest=nbest, alignment=alignment)
    try:
        check_nbest(decode, "nbest", "beam")
    except RefusedCombination as error:
        raise Rejected(422, str(error)) from None
    return decode


def response_body(hypotheses: list[list[Any]], nbest: int, alignments: bool = False, confidences: bool = False) -> dict:
    """translations and scores (and alignments: Pharaoh `i-j` strings; confidences: the
    confidence scores, null for a blank sentence) of the best hypotheses; with nbest > 1,
    every hypothesis under "nbest" (each with its "confidence" where asked)."""
    body: dict[str, Any] = {
        "translations": [hyps[0].text for hyps in hypotheses],
        "scores": [hyps[0].score for hyps in hypotheses],
    }
    if alignments:
        body["alignments"] = [pharaoh(hyps[0].alignment or []) for hyps in hypotheses]
    # MBR decoding's expected utility (a confidence score) and reranking's score, when decoded with them.
    plural = {"expected_utility": "expected_utilities", "rerank_score": "rerank_scores"}
    extras = [key for key in plural if any(getattr(hyps[0], key) is not None for hyps in hypotheses)]
    if confidences:  # asked for: the key is there even when every sentence is blank
        plural["confidence"] = "confidences"
        extras.append("confidence")
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
