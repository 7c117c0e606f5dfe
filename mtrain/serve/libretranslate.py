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
language or format, over a limit), 403 (API keys, serve.access) and 429 (the rate limit);
a number that is no number (alternatives: Infinity, NaN or 1e400) is 422, where LibreTranslate
fails (500).
The request takes the path of mtrain's own (`translation.Served`: the request pipeline of
mtrain.decode.requests.pipeline), so the same sentence gets the same translation through either API
and through `mtrain translate`. Where mtrain differs:
- mtrain's controls, as two more fields: `terms` (a glossary beside the server's `terms=`:
  [source term, target term] pairs in JSON, or lines `source term<TAB>target term` as in a
  terms file, what a form can carry) and `avoid` (phrases no translation may contain: a list,
  or one per line); per-line prefixes and constraints are mtrain's API's (`text`).
- What cannot be decoded together (the server's MBR with format=html, terms on a CTranslate2
  or sampling server: mtrain.decoding_rules) is refused with 422 naming the field, in the
  words mtrain's API and `mtrain translate` use.
- Each line of a text is translated as one sentence (mtrain's models translate sentences; a
  line with several is translated whole, as `mtrain translate` does) and the lines are joined
  with "\\n" again. All lines of a request go to the batcher at once, beside other requests'.
- source=auto: mtrain detects no language. A model that translates from one language takes
  "auto" for it and answers `detectedLanguage` with that language; a model with several
  source languages refuses it (400: name the source).
- format=html: each line's tags are taken out, the text translated and the tags put back
  around the aligned words (mtrain.decode.requests.markup, as mtrain's own `format`); a line's markup
  must be complete within the line (400 naming the line otherwise).
- mtrain's confidence score, on request: `"confidence": true` (or `confidence=true` in a
  form) adds `"translationConfidence"`, a number in [0, 1] per text (a list for a list q)
  estimating its quality (mtrain.decode.translation.confidence; the number mtrain's API
  gives the same sentence): a text of several lines gets its lines' scores averaged, weighted
  by their tokens; a blank text null. (LibreTranslate's `detectedLanguage.confidence` is a
  percentage of another thing: hence the distinct name.) Clients that do not ask never see it.
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

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from fastapi import APIRouter, FastAPI, HTTPException, Request

from mtrain.config import ServeConfig
from mtrain.data.languages import language_name
from mtrain.decode.requests.pipeline import Options, with_options
from mtrain.decode.requests.request import DecodeRequest
from mtrain.errors import MtrainError
from mtrain.serve.access import BODY_FIELDS
from mtrain.serve.batcher import Batcher
from mtrain.serve.model import ServedModel
from mtrain.serve.translation import Rejected, Served, check_controls_agree, lone_surrogate

LIBRETRANSLATE_PATH = "/libretranslate/translate"
FORM = "application/x-www-form-urlencoded"
MULTIPART = "multipart/form-data"
LIBRE_FIELDS = {"q", "source", "target"}  # any of them makes a body a LibreTranslate request

# Phrases a request may name (each costs search work), as mtrain's API allows.
MAX_PHRASES = 32
MAX_TERMS = 256


@dataclass(frozen=True)
class LibreRequest:
    texts: list[str]  # q, as a list
    batch: bool  # q was a list: so is translatedText
    source: str
    target: str
    alternatives: int
    html: bool = False  # format=html: inline tags out and back (mtrain.decode.requests.markup)
    terms: tuple[tuple[str, str], ...] = ()  # mtrain's `terms`: beside the server's glossary
    avoid: tuple[str, ...] = ()  # mtrain's `avoid`: phrases no translation may contain
    confidence: bool = False  # mtrain's `confidence`: translationConfidence in the answer


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
    given_alternatives = fields.get("alternatives") or 0
    if isinstance(given_alternatives, float) and not math.isfinite(given_alternatives):
        # JSON's 1e400 is Infinity to Python's parser (as are Infinity and NaN, which it also takes)
        raise HTTPException(
            422,
            f"alternatives: {json.dumps(given_alternatives)} is not a whole number; give 0..{cfg.max_beam - 1}",
        )
    try:
        alternatives = max(0, int(given_alternatives))
    except (TypeError, ValueError):
        raise invalid("Invalid request: alternatives parameter is not a number") from None
    if alternatives + 1 > cfg.max_beam:
        raise invalid(
            f"Invalid request: alternatives parameter must be <= {cfg.max_beam - 1} (max_beam={cfg.max_beam})"
        )
    text_format = fields.get("format") or "text"
    if text_format not in ("text", "html"):
        raise invalid(f"{text_format} format is not supported")
    terms, avoid = term_pairs(fields.get("terms"), cfg), phrases(fields.get("avoid"), cfg)
    try:
        check_controls_agree(terms, avoid, ignore_case=cfg.terms_ignore_case)
    except MtrainError as error:
        raise invalid(str(error)) from None
    return LibreRequest(
        texts,
        batch,
        *direction(source, target, model),
        alternatives,
        html=text_format == "html",
        terms=terms,
        avoid=avoid,
        confidence=flag("confidence", fields.get("confidence")),
    )


def flag(key: str, value: Any) -> bool:
    """A yes/no field: JSON's true/false, or a form's true/false/1/0 (absent or empty: no)."""
    if value is None or isinstance(value, bool):
        return bool(value)
    words = {"true": True, "1": True, "false": False, "0": False, "": False}
    if isinstance(value, str) and value.strip().lower() in words:
        return words[value.strip().lower()]
    raise invalid(f"Invalid request: {key} must be true or false")


def term_pairs(value: Any, cfg: ServeConfig) -> tuple[tuple[str, str], ...]:
    """mtrain's `terms` field: [source term, target term] pairs (JSON), or lines of `source
    term<TAB>target term` as in a terms= file (a form's string); 400 for anything else."""
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        rows: list[Any] = [line.split("\t") for line in value.splitlines() if line.strip() and not line.startswith("#")]
    else:
        rows = value if isinstance(value, list) else [None]
    pairs = []
    for row in rows:
        if not (isinstance(row, list) and len(row) == 2 and all(isinstance(t, str) and t.strip() for t in row)):
            raise invalid(
                "Invalid request: terms must be [source term, target term] pairs, or lines `source term<TAB>target term`"
            )
        pairs.append((row[0], row[1]))
    check_phrases("terms", [term for pair in pairs for term in pair], MAX_TERMS * 2, cfg)
    return tuple(pairs)


def phrases(value: Any, cfg: ServeConfig) -> tuple[str, ...]:
    """mtrain's `avoid` field: a list of phrases (JSON), or one phrase per line (a string)."""
    if value is None or value == "":
        return ()
    given = value.splitlines() if isinstance(value, str) else value
    if not isinstance(given, list) or not all(isinstance(phrase, str) for phrase in given):
        raise invalid("Invalid request: avoid must be a list of phrases, or one phrase per line")
    kept = tuple(phrase for phrase in given if phrase.strip())
    check_phrases("avoid", list(kept), MAX_PHRASES, cfg)
    return kept


def check_phrases(key: str, given: list[str], most: int, cfg: ServeConfig) -> None:
    if len(given) > most:
        raise invalid(f"Invalid request: {key}: {len(given)} phrases, at most {most}")
    longest = max((len(phrase) for phrase in given), default=0)
    if longest > cfg.max_sentence_chars:
        raise invalid(f"max_sentence_chars: a phrase of {key} has {longest} characters")
    for index, phrase in enumerate(given):
        # (terms come here as a flat list: its pair and place within the pair)
        field = f"terms[{index // 2}][{index % 2}]" if key == "terms" else f"{key}[{index}]"
        problem = lone_surrogate(field, phrase)
        if problem is not None:
            raise invalid(problem)


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


def text_confidences(lines: list[list[str]], hypotheses: list[list[Any]]) -> list[float | None]:
    """Per text, the confidence of its translation: its lines' scores (`Hypothesis.confidence`,
    set by the pipeline) averaged with their output tokens (EOS counted) as weights, as the
    mean token log-probability they estimate pools its tokens; None when every line is blank."""
    results, position = [], 0
    for text_lines in lines:
        scored = [
            hyps[0] for hyps in hypotheses[position : position + len(text_lines)] if hyps[0].confidence is not None
        ]
        position += len(text_lines)
        weights = [len(hyp.tokens) + 1 for hyp in scored]
        total = sum(weights)
        results.append(
            sum(w * hyp.confidence for w, hyp in zip(weights, scored, strict=True)) / total if total else None
        )
    return results


def request_schema(model: ServedModel, cfg: ServeConfig) -> dict[str, Any]:
    """The OpenAPI body of LibreTranslate's POST translate (the route reads its own body): for
    clients and the API fuzz run (tests/test_serve.py), JSON and a form alike."""
    targets = sorted({target for targets in model.directions.values() for target in targets})
    schema = {
        "type": "object",
        "properties": {
            "q": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
            "source": {"type": "string", "enum": [*model.directions, "auto"]},
            "target": {"type": "string", "enum": targets},
            "format": {"type": "string", "enum": ["text", "html"]},
            "alternatives": {"type": "integer", "minimum": 0, "maximum": cfg.max_beam - 1},
            "api_key": {"type": "string"},
            "terms": {
                "anyOf": [
                    {"type": "string"},
                    {"type": "array", "items": {"type": "array", "items": {"type": "string"}}},
                ]
            },
            "avoid": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
            "confidence": {"anyOf": [{"type": "boolean"}, {"type": "string", "enum": ["true", "false", "1", "0"]}]},
        },
        "required": ["q", "source", "target"],
    }
    content = {kind: {"schema": schema} for kind in ("application/json", FORM)}
    return {"requestBody": {"required": True, "content": content}}


def libretranslate_router(served: Served, batcher: Callable[[], Batcher]) -> APIRouter:
    """LibreTranslate's routes for `served`; `batcher()`: the app's batcher (started with the app)."""
    model, cfg = served.model, served.cfg
    router = APIRouter()

    @router.get("/languages")
    async def languages() -> list[dict]:
        codes = list(model.directions)
        codes += [target for targets in model.directions.values() for target in targets if target not in codes]
        return [
            {"code": code, "name": language_name(code), "targets": list(model.directions.get(code, []))}
            for code in dict.fromkeys(codes)
        ]

    @router.post(LIBRETRANSLATE_PATH, openapi_extra=request_schema(model, cfg))
    async def translate(request: Request) -> dict:
        fields = getattr(request.state, BODY_FIELDS, None)
        if fields is None:  # the dispatch middleware fills it; called without it, read the body here
            fields = body_fields(request.headers.get("content-type", ""), await request.body()) or {}
        libre = parse_request(fields, model, cfg)
        lines = split_lines(libre.texts)
        check_sizes(lines, cfg)
        requests, options = pipeline_request(libre, lines, served)
        try:
            results, confidences = await served.translate(
                batcher(),
                requests,
                options,
                lambda hypotheses, _nbest, **_: (
                    join_translations(lines, hypotheses, libre.alternatives),
                    text_confidences(lines, hypotheses),
                ),
                invalid=400,
            )
        except Rejected as error:
            raise HTTPException(error.status, str(error)) from None
        body: dict[str, Any] = {"translatedText": [r[0] for r in results] if libre.batch else results[0][0]}
        if libre.alternatives > 0:
            body["alternatives"] = [r[1:] for r in results] if libre.batch else results[0][1:]
        if libre.confidence:
            body["translationConfidence"] = confidences if libre.batch else confidences[0]
        if fields.get("source") == "auto":
            detected = {"confidence": 100.0, "language": libre.source}
            body["detectedLanguage"] = [detected] * len(results) if libre.batch else detected
        return body

    return router


def pipeline_request(
    libre: LibreRequest, lines: list[list[str]], served: Served
) -> tuple[list[DecodeRequest], Options]:
    """Each line of each text as a request of the pipeline, with the request's alternatives
    (the beam raised to hold them), format, avoided phrases and terms beside the server's."""
    cfg = served.cfg
    nbest = libre.alternatives + 1
    decode = with_options(cfg.decode, beam=max(cfg.decode.beam, nbest), nbest=nbest)
    if (
        libre.html
    ):  # (links are not part of LibreTranslate's answer: the word links markup needs, whatever the server's)
        decode = with_options(decode, alignment="word")
    numbered = enumerate((line for text_lines in lines for line in text_lines), start=1)
    requests = [DecodeRequest(line, avoid=libre.avoid, where=f"q: line {number}") for number, line in numbered]
    options = Options(
        decode,
        "html" if libre.html else "text",
        libre.target,
        served.glossary_with(list(libre.terms)),
        confidence=served.confidence if libre.confidence else None,
    )
    return requests, options


def add_libretranslate(app: FastAPI, served: Served, batcher: Callable[[], Batcher]) -> None:
    """LibreTranslate's routes on `app`, and the dispatch of POST /translate between the APIs."""
    app.include_router(libretranslate_router(served, batcher))
    app.add_middleware(LibreTranslateDispatch)
