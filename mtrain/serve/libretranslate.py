"""LibreTranslate's API on `mtrain serve`, so its clients (libretranslatepy, editor and
browser plugins, the web page at `GET /`) translate with an mtrain model.

    POST /translate  {"q": "Ein Hund.\\nZwei Katzen.", "source": "de", "target": "en"}
                  -> {"translatedText": "A dog.\\nTwo cats."}
                     q a list of texts -> translatedText a list; "alternatives": N -> also
                     "alternatives": up to N other translations (a list per text for a list q)
    GET  /languages  -> [{"code": "de", "name": "German", "targets": ["en"]},
                         {"code": "en", "name": "English", "targets": []}]

One path, two APIs. A POST /translate whose body is a form (application/x-www-form-urlencoded,
what libretranslatepy sends), or a JSON object with LibreTranslate's q, source or target and
without mtrain's `text`, is LibreTranslate's; anything else stays mtrain's (serve.app). `LibreTranslateDispatch`, an ASGI
middleware, reads the body once (after serve.protocol.RequestBody has bounded it), keeps its fields
in the request's state and routes the request to `LIBRETRANSLATE_PATH`, which can also be
called directly.

As LibreTranslate: the fields q, source, target, format, alternatives, api_key (others are
ignored); errors are `{"error": "..."}` with 400 (a missing or wrong field, an unsupported
language or format, over a limit), 403 (API keys, serve.access) and 429 (the rate limit).
Where mtrain differs:
- Each line of a text is translated as one sentence (mtrain's models translate sentences; a
  line with several is translated whole, as `mtrain translate` does) and the lines are joined
  with "\\n" again. All lines of a request go to the batcher at once, beside other requests'.
- source=auto: mtrain detects no language. A model that translates from one language takes
  "auto" for it and answers `detectedLanguage` with that language; a model with several
  source languages refuses it (400: name the source).
- format=html: each line's tags are taken out, the text translated and the tags put back
  around the aligned words (mtrain.decode.markup, as mtrain's own `format`); a line's markup
  must be complete within the line (400 naming the line otherwise).
- alternatives: N asks the beam for N+1 hypotheses per line (beam raised to N+1 when below);
  N+1 may not exceed max_beam. An alternative joins each line's next hypothesis; repeats and
  copies of the translation are dropped, as LibreTranslate drops them.
- multipart/form-data bodies are refused (400): send JSON or a urlencoded form.
- Limits: max_sentences counts the lines of the whole request, max_sentence_chars each line
  (400, as LibreTranslate's char and batch limits); request_timeout_s gives 504.
- LibreTranslate's other routes (/detect, /translate_file, /suggest, /frontend/settings) do
  not exist here (404).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from fastapi import APIRouter, FastAPI, HTTPException, Request

from mtrain.config import DecodeConfig, ServeConfig, with_values
from mtrain.data.languages import language_name
from mtrain.decode.markup import Markup, MarkupError, parse_markup, restore_markup
from mtrain.errors import MtrainError
from mtrain.serve.access import BODY_FIELDS
from mtrain.serve.batcher import BatcherClosed
from mtrain.serve.model import ServedModel

LIBRETRANSLATE_PATH = "/libretranslate/translate"
FORM = "application/x-www-form-urlencoded"
MULTIPART = "multipart/form-data"
LIBRE_FIELDS = {"q", "source", "target"}  # any of them makes a body a LibreTranslate request

# Submits sentences to the server's batcher: (sentences, decode settings, target language) -> their hypotheses.
Submit = Callable[[list[str], DecodeConfig, str | None], Future]


@dataclass(frozen=True)
class LibreRequest:
    texts: list[str]  # q, as a list
    batch: bool  # q was a list: so is translatedText
    source: str
    target: str
    alternatives: int
    html: bool = False  # format=html: inline tags out and back (mtrain.decode.markup)


def body_fields(content_type: str, body: bytes) -> dict[str, Any] | None:
    """LibreTranslate's fields from a body, or None when it is not a LibreTranslate request
    (mtrain's: a JSON object without `q`, or not JSON at all)."""
    kind = content_type.split(";")[0].strip().lower()
    if kind == FORM:
        form = {name: values[0] for name, values in parse_qs(body.decode("utf-8", "replace")).items()}
        if LIBRE_FIELDS & form.keys():
            return form
        # No LibreTranslate field: mtrain's own request, whose JSON is read whatever the
        # Content-Type says (its handler answers a form of other fields with a 400 naming it).
    if kind == MULTIPART:
        return {"_multipart": True}
    try:
        fields = json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError):  # RecursionError: nested too deeply
        return None
    if not isinstance(fields, dict) or "text" in fields or not LIBRE_FIELDS & fields.keys():
        return None
    return fields


class LibreTranslateDispatch:
    """ASGI middleware: a LibreTranslate request to POST /translate goes to LIBRETRANSLATE_PATH,
    its fields in the request's state (`BODY_FIELDS`); the body is replayed to the route."""

    def __init__(self, app: Callable) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if not (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and scope["path"] in ("/translate", LIBRETRANSLATE_PATH)
        ):
            await self.app(scope, receive, send)
            return
        messages, chunks = [], []
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        content_type = dict(scope["headers"]).get(b"content-type", b"").decode("latin-1")
        fields = body_fields(content_type, b"".join(chunks))
        if fields is not None or scope["path"] == LIBRETRANSLATE_PATH:
            scope = {**scope, "path": LIBRETRANSLATE_PATH, "raw_path": LIBRETRANSLATE_PATH.encode()}
            scope.setdefault("state", {})
            scope["state"] = {**scope["state"], BODY_FIELDS: fields or {}}

        async def replay() -> dict:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)


def invalid(message: str) -> HTTPException:
    return HTTPException(400, message)


def parse_request(fields: dict[str, Any], model: ServedModel, cfg: ServeConfig) -> LibreRequest:
    """LibreTranslate's request from its fields, checked as LibreTranslate checks it."""
    if fields.get("_multipart"):
        raise invalid(f"body: multipart/form-data is not read here; send JSON or a form ({FORM})")
    q = fields.get("q")
    for name in ("q", "source", "target"):
        if not fields.get(name):
            raise invalid(f"Invalid request: missing {name} parameter")
    batch = isinstance(q, list)
    given: list[Any] = q if isinstance(q, list) else [q]
    texts = [text for text in given if isinstance(text, str)]
    if len(texts) != len(given):
        raise invalid("Invalid request: q must be a text or a list of texts")
    source, target = str(fields["source"]), str(fields["target"])
    try:
        alternatives = max(0, int(fields.get("alternatives") or 0))
    except (TypeError, ValueError):
        raise invalid("Invalid request: alternatives parameter is not a number") from None
    if alternatives + 1 > cfg.max_beam:
        raise invalid(
            f"Invalid request: alternatives parameter must be <= {cfg.max_beam - 1} (max_beam={cfg.max_beam})"
        )
    text_format = fields.get("format") or "text"
    if text_format not in ("text", "html"):
        raise invalid(f"{text_format} format is not supported")
    return LibreRequest(texts, batch, *direction(source, target, model), alternatives, html=text_format == "html")


def html_lines(lines: list[list[str]]) -> list[Markup]:
    """Each line's text and tags (format=html); 400 naming the line whose markup is malformed."""
    markups = []
    for number, line in enumerate((line for text_lines in lines for line in text_lines), start=1):
        try:
            markups.append(parse_markup(line, "html"))
        except MarkupError as error:
            raise invalid(f"q: line {number}: format=html: {error}") from None
    return markups


def direction(source: str, target: str, model: ServedModel) -> tuple[str, str]:
    """(source, target) as the model translates them; "auto" is its one source language."""
    directions = model.directions
    if source == "auto":
        if len(directions) != 1:
            choices = ", ".join(directions) or "none recorded"
            raise invalid(f"source: auto needs language detection, which mtrain does not do; name it ({choices})")
        source = next(iter(directions))
    known = {*directions, *(target for targets in directions.values() for target in targets)}
    for code in (source, target):
        if code not in known:
            raise invalid(f"{code} is not supported")
    if target not in directions.get(source, []):
        raise invalid(
            f"{language_name(target)} ({target}) is not available as a target language from "
            f"{language_name(source)} ({source})"
        )
    return source, target


def split_lines(texts: list[str]) -> list[list[str]]:
    return [text.replace("\r\n", "\n").replace("\r", "\n").split("\n") for text in texts]


def check_sizes(lines: list[list[str]], cfg: ServeConfig) -> None:
    count = sum(len(text_lines) for text_lines in lines)
    if count > cfg.max_sentences:
        raise invalid(
            f"max_sentences: {count} lines in one request, the limit is {cfg.max_sentences}; split the request"
        )
    longest = max((len(line) for text_lines in lines for line in text_lines), default=0)
    if longest > cfg.max_sentence_chars:
        raise invalid(f"max_sentence_chars: a line of {longest} characters, the limit is {cfg.max_sentence_chars}")


def join_translations(lines: list[list[str]], hypotheses: list[list[Any]], alternatives: int) -> list[list[str]]:
    """Per text, its translation and then its alternatives: lines joined with "\\n", the i-th
    of each line's hypotheses (its best where it has fewer), repeats dropped."""
    results, position = [], 0
    for text_lines in lines:
        per_line = hypotheses[position : position + len(text_lines)]
        position += len(text_lines)
        candidates = [
            "\n".join((hyps[rank] if rank < len(hyps) else hyps[0]).text for hyps in per_line)
            for rank in range(alternatives + 1)
        ]
        translation, others = candidates[0], []
        for candidate in candidates[1:]:
            if candidate != translation and candidate not in others:
                others.append(candidate)
        results.append([translation, *others])
    return results


def libretranslate_router(model: ServedModel, cfg: ServeConfig, submit: Submit) -> APIRouter:
    router = APIRouter()

    @router.get("/languages")
    async def languages() -> list[dict]:
        codes = list(model.directions)
        codes += [target for targets in model.directions.values() for target in targets if target not in codes]
        return [
            {"code": code, "name": language_name(code), "targets": list(model.directions.get(code, []))}
            for code in dict.fromkeys(codes)
        ]

    @router.post(LIBRETRANSLATE_PATH)
    async def translate(request: Request) -> dict:
        fields = getattr(request.state, BODY_FIELDS, None)
        if fields is None:  # the dispatch middleware fills it; called without it, read the body here
            fields = body_fields(request.headers.get("content-type", ""), await request.body()) or {}
        libre = parse_request(fields, model, cfg)
        lines = split_lines(libre.texts)
        check_sizes(lines, cfg)
        nbest = libre.alternatives + 1
        decode = with_values(cfg.decode, beam=max(cfg.decode.beam, nbest), nbest=nbest)
        sentences = [line for text_lines in lines for line in text_lines]
        markups = html_lines(lines) if libre.html else None
        if markups is not None:  # the text alone is translated; the tags go back by word alignments
            sentences = [markup.text for markup in markups]
            decode = with_values(decode, alignment="word")
        try:
            future = submit(sentences, decode, libre.target)
        except BatcherClosed:
            raise HTTPException(503, "the server is shutting down; retry on another instance") from None
        try:
            hypotheses = await asyncio.wait_for(asyncio.wrap_future(future), cfg.request_timeout_s)
        except asyncio.TimeoutError:
            future.cancel()
            raise HTTPException(
                504, f"request_timeout_s: not translated within {cfg.request_timeout_s:g} s; retry later"
            ) from None
        except MtrainError as error:
            raise invalid(str(error)) from None
        if markups is not None:
            for markup, hyps in zip(markups, hypotheses, strict=True):
                for hyp in hyps:
                    hyp.text = restore_markup(markup, hyp.text, hyp.alignment or [])
        results = join_translations(lines, hypotheses, libre.alternatives)
        body: dict[str, Any] = {"translatedText": [r[0] for r in results] if libre.batch else results[0][0]}
        if libre.alternatives > 0:
            body["alternatives"] = [r[1:] for r in results] if libre.batch else results[0][1:]
        if fields.get("source") == "auto":
            detected = {"confidence": 100.0, "language": libre.source}
            body["detectedLanguage"] = [detected] * len(results) if libre.batch else detected
        return body

    return router


def add_libretranslate(app: FastAPI, model: ServedModel, cfg: ServeConfig, submit: Submit) -> None:
    """LibreTranslate's routes on `app`, and the dispatch of POST /translate between the APIs."""
    app.include_router(libretranslate_router(model, cfg, submit))
    app.add_middleware(LibreTranslateDispatch)
