"""The HTTP face of `mtrain serve`: routes, request limits and JSON errors (FastAPI).

    GET  /health     {"status": "ok", "model": ..., "batches": N, ...}
    POST /translate  {"text": ["...", ...], "beam": 5, "nbest": 1, "tgt_lang": "en"}
                  -> {"translations": ["...", ...], "scores": [...]}   (+ "nbest" when nbest > 1)

Every answer is JSON, errors too: `{"error": "<field or limit key>: <what is wrong>"}` with a
4xx status (400 malformed JSON, 413 over a size limit, 422 a wrong value or type, 404/405 no
such route), 504 past `request_timeout_s`, 503 while shutting down, and a 500 that names
only the exception type, never a traceback. The body is bounded before it is parsed
(`BodyLimit`). Handlers never decode: they submit the request's sentences to the batcher
(`mtrain.decode.batcher`), whose one worker thread decodes the sentences of concurrent
requests together, and await the result.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from starlette.exceptions import HTTPException as StarletteHTTPException

from mtrain.cli.serve_access import add_access_control
from mtrain.cli.serve_libretranslate import LIBRETRANSLATE_PATH, add_libretranslate
from mtrain.cli.serve_model import ServedModel, UnknownTargetLanguage, check_target_language
from mtrain.cli.serve_page import page_router
from mtrain.config import DecodeConfig, Sampling, ServeConfig, with_values
from mtrain.decode.batcher import Batcher, BatcherClosed
from mtrain.errors import MtrainError

log = logging.getLogger("mtrain.serve")


class TranslateRequest(BaseModel):
    """The body of POST /translate. Strict: "5" is not a beam, "a" is not a list of sentences."""

    model_config = ConfigDict(extra="forbid", strict=True)

    text: list[str]
    beam: int | None = None  # default: the server's decode.beam
    nbest: int | None = None  # default: the server's decode.nbest
    tgt_lang: str | None = None  # one of the model's target languages; null: its one (not for a multilingual model)


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


class BodyLimit:
    """ASGI middleware: a request body over `max_bytes` is refused with 413 before any of it is
    parsed (by its Content-Length, or by counting a chunked body as it arrives)."""

    def __init__(self, app: Callable, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = f"max_request_bytes: the body is over the limit of {self.max_bytes} bytes"
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            message = too_large if declared.isdigit() else "content-length: not a number of bytes"
            await error_response(413 if declared.isdigit() else 400, message)(scope, receive, send)
            return
        messages, size = [], 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                await error_response(413, too_large)(scope, receive, send)
                return
            if not message.get("more_body", False):
                break

        async def replay() -> dict:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)


def build_app(model: ServedModel, cfg: ServeConfig) -> FastAPI:
    """The service for `model` with `cfg`'s limits; its batcher lives as long as the app runs
    (started and drained by the app's lifespan)."""
    state: dict[str, Any] = {"batcher": None, "started": time.time()}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        def decode(sentences: list[str], setting: Setting) -> list[Any]:
            return model.translate(sentences, setting.decode, setting.tgt_lang)

        state["batcher"] = Batcher(
            decode, cfg.max_batch_sentences, cfg.max_wait_ms / 1000.0, key=setting_key, name="mtrain-decoder"
        )
        yield
        # uvicorn has already answered every request in flight: what is left is queued work of none.
        state["batcher"].close(timeout=cfg.request_timeout_s)
        log.info("stopped after %d batches", state["batcher"].stats().batches)

    app = FastAPI(title="mtrain serve", docs_url=None, redoc_url=None, lifespan=lifespan)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_request, error: RequestValidationError) -> JSONResponse:
        return error_response(*describe_validation_error(error.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request, error: StarletteHTTPException) -> JSONResponse:
        return error_response(error.status_code, str(error.detail))

    @app.exception_handler(Rejected)
    async def rejected(_request, error: Rejected) -> JSONResponse:
        return error_response(error.status, str(error))

    @app.exception_handler(Exception)
    async def internal_error(_request, error: Exception) -> JSONResponse:
        # uvicorn logs the traceback (the exception goes on past this answer); the client gets one line.
        return error_response(500, f"internal error ({type(error).__name__}); the server's log has the details")

    @app.get("/health")
    async def health() -> dict:
        stats = state["batcher"].stats()
        return {
            "status": "ok",
            "model": model.description,
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
            "uptime_s": round(time.time() - state["started"], 3),
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

    @app.post("/translate")
    async def translate(request: TranslateRequest) -> dict:
        try:
            tgt_lang = check_target_language(request.tgt_lang, model.target_languages())
        except UnknownTargetLanguage as error:
            raise Rejected(422, str(error)) from None
        check_sizes(request.text, cfg)
        decode = request_decoding(request, cfg)
        try:
            future = state["batcher"].submit(request.text, Setting(decode, tgt_lang))
        except BatcherClosed:
            raise Rejected(503, "the server is shutting down; retry on another instance") from None
        try:
            hypotheses = await asyncio.wait_for(asyncio.wrap_future(future), cfg.request_timeout_s)
        except asyncio.TimeoutError:
            future.cancel()  # its sentences leave the queue if they are not decoding yet
            raise Rejected(
                504,
                f"request_timeout_s: not translated within {cfg.request_timeout_s:g} s; "
                "retry later or send fewer sentences",
            ) from None
        except MtrainError as error:
            raise Rejected(422, str(error)) from None
        return response_body(hypotheses, decode.nbest)

    # The web page, LibreTranslate's API beside mtrain's, who may translate (serve_page, _libretranslate, _access).
    app.include_router(page_router())
    add_access_control(app, cfg, paths=("/translate", LIBRETRANSLATE_PATH))
    add_libretranslate(app, model, cfg, lambda text, decode, lang: state["batcher"].submit(text, Setting(decode, lang)))
    app.add_middleware(BodyLimit, max_bytes=cfg.max_request_bytes)
    return app


def check_sizes(sentences: list[str], cfg: ServeConfig) -> None:
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


def request_decoding(request: TranslateRequest, cfg: ServeConfig) -> DecodeConfig:
    """The server's decode settings with the request's beam and nbest."""
    beam = cfg.decode.beam if request.beam is None else request.beam
    nbest = cfg.decode.nbest if request.nbest is None else request.nbest
    for key, value in (("beam", beam), ("nbest", nbest)):
        if not 1 <= value <= cfg.max_beam:
            raise Rejected(422, f"{key}: {value} is outside 1..{cfg.max_beam} (max_beam={cfg.max_beam})")
    if nbest > beam and cfg.decode.sampling == Sampling.none:
        raise Rejected(422, f"nbest: {nbest} is above beam={beam} (beam search keeps only `beam` hypotheses)")
    return with_values(cfg.decode, beam=beam, nbest=nbest)


def response_body(hypotheses: list[list[Any]], nbest: int) -> dict:
    body: dict[str, Any] = {
        "translations": [hyps[0].text for hyps in hypotheses],
        "scores": [hyps[0].score for hyps in hypotheses],
    }
    if nbest > 1:
        body["nbest"] = [[{"text": hyp.text, "score": hyp.score} for hyp in hyps] for hyps in hypotheses]
    return body


def describe_validation_error(errors: list[dict]) -> tuple[int, str]:
    """(status, one line naming the field) for FastAPI's validation errors: 400 for a body that
    is not JSON, 422 for a wrong field."""
    first = errors[0] if errors else {"loc": ("body",), "msg": "invalid request", "type": ""}
    if first.get("type") == "json_invalid":
        reason = (first.get("ctx") or {}).get("error", first.get("msg", ""))
        return 400, f'body: malformed JSON ({reason}); send a JSON object such as {{"text": ["..."]}}'
    loc = [part for part in first.get("loc", ()) if part != "body"]
    field = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".") or "body"
    if field == "body" and first.get("type") in ("model_type", "model_attributes_type", "dict_type", "missing"):
        return 422, (
            'body: a JSON object with "text": [sentences] is required (and the header Content-Type: application/json)'
        )
    message = str(first.get("msg", "invalid"))
    if first.get("type") == "extra_forbidden":
        message = "unknown field (the fields: text, beam, nbest, tgt_lang)"
    return 422, f"{field}: {message}"
