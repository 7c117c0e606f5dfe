"""What both HTTP APIs translate with (mtrain's JSON API, `app.py`; LibreTranslate's,
`libretranslate.py`): one path from their requests to the batcher and back.

`Served` holds the model, the server's settings and glossary (`terms=FILE.tsv`), and what the
constraints and terms of all requests did. Its `translate` takes a request read into the
pipeline's `DecodeRequest`s and `Options` (mtrain.decode.pipeline) through the pipeline's
steps: the rules (mtrain.decoding_rules: 422 naming the field, the wording translate's
one-line error uses), markup out and terms found, the batcher (whose worker decodes the
sentences of concurrent requests together: `ServedModel.translate`, the pipeline's decoder
step), the tags back. So a request gives the same text and the same refusal through either API
and through `mtrain translate`.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from mtrain.config import DecodeConfig, ServeConfig
from mtrain.decode.pipeline import (
    DecodeRequest,
    Options,
    PipelineStats,
    Prepared,
    check_requests,
    finish_requests,
    prepare_requests,
)
from mtrain.decode.terminology import Glossary, glossary_of, read_glossary
from mtrain.decoding_rules import RefusedCombination
from mtrain.errors import MtrainError
from mtrain.serve.batcher import Batcher, BatcherClosed
from mtrain.serve.model import ServedModel


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


def server_glossary(cfg: ServeConfig) -> Glossary | None:
    """The server's `terms=FILE.tsv`, read once (its file checked before the model loaded)."""
    return read_glossary(cfg.terms, cfg.terms_ignore_case) if cfg.terms is not None else None


@dataclasses.dataclass
class Served:
    """What both APIs translate with: the model, the server's settings and glossary, and what
    the constraints and terms of all requests did."""

    model: ServedModel
    cfg: ServeConfig
    glossary: Glossary | None
    stats: PipelineStats

    def glossary_with(self, pairs: list[tuple[str, str]] | None) -> Glossary | None:
        return glossary_of(self.glossary, pairs, self.cfg.terms_ignore_case)

    def check(self, requests: Sequence[DecodeRequest], options: Options) -> list[Prepared]:
        """The request's sentences prepared for the batcher; RefusedCombination for what the
        rules refuse, MtrainError for malformed markup (each names the field)."""
        term_aware = self.model.term_aware
        check_requests(requests, options, ctranslate2=self.model.engine_name == "ctranslate2", term_aware=term_aware)
        return prepare_requests(requests, options, term_aware)

    async def translate(
        self,
        batcher: Batcher,
        requests: Sequence[DecodeRequest],
        options: Options,
        answer: Callable[..., Any],
        invalid: int = 422,
    ) -> Any:
        """`answer(hypotheses, nbest, alignments=...)` for the requests, as the pipeline
        decodes them; Rejected: 422 for what the rules refuse, `invalid` (LibreTranslate: 400)
        for malformed markup or a sentence the model cannot take, as `translated` says."""
        try:
            prepared = self.check(requests, options)
        except RefusedCombination as error:
            raise Rejected(422, str(error)) from None
        except MtrainError as error:
            raise Rejected(invalid, str(error)) from None
        setting = Setting(options.decoding(), options.tgt_lang)
        hypotheses = await translated(batcher, prepared, setting, self.cfg.request_timeout_s, invalid)
        finish_requests(prepared, hypotheses, options, self.stats)
        return answer(hypotheses, options.decode.nbest, alignments=options.decode.aligns)


async def translated(
    batcher: Batcher, sentences: Sequence[Prepared], setting: Setting, timeout_s: float, invalid: int = 422
) -> list[Any]:
    """The batcher's hypotheses for `sentences`, or Rejected: 503 shutting down, 504 past
    `timeout_s`, `invalid` (422) for an MtrainError (a sentence the model cannot take)."""
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
        raise Rejected(invalid, str(error)) from None
