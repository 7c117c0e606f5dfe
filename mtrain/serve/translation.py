"""What both HTTP APIs translate with (mtrain's JSON API, `app.py`; LibreTranslate's,
`libretranslate.py`): one path from their requests to the batcher and back.

`Served` holds the model, the server's settings and glossary (`terms=FILE.tsv`), the run's
confidence scores (given where a request asks), and what the constraints and terms of all
requests did. Its `translate` takes a request read into the
pipeline's `DecodeRequest`s and `Options` (mtrain.decode.requests.pipeline) through the pipeline's
steps: the rules (mtrain.decoding_rules: 422 naming the field, the wording translate's
one-line error uses), markup out and terms found, the batcher (whose worker decodes the
sentences of concurrent requests together: `ServedModel.translate`, the pipeline's decoder
step), the tags back. So a request gives the same text and the same refusal through either API
and through `mtrain translate`.

What one request may cost is bounded before it is queued: a constrained search's candidates
grow with its sentence's constraints (its own and the terms found in it) and its steps with
the source, so a sentence has at most `max_sentence_constraints` constraints and a request at
most `max_constrained_work` source tokens x constraints over its sentences (413 naming the
key). Requests with constraints decode in a lane of their own (`Lane`), so a slow constrained
search never holds up plain requests, and a request not answered within `request_timeout_s`
gets 504 and its decode stops at its next step (the batcher's `stop`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
from collections.abc import Callable, Sequence
from typing import Any

from mtrain.config import DecodeConfig, ServeConfig
from mtrain.decode.requests.pipeline import Options, PipelineStats, Translation, begin_translation
from mtrain.decode.requests.request import DecodeRequest
from mtrain.decode.requests.terminology import Glossary, TermTargets, glossary_of, read_glossary
from mtrain.decode.translation.confidence import Confidence, run_confidence
from mtrain.decoding_rules import RefusedCombination
from mtrain.errors import MtrainError
from mtrain.serve.batcher import Batcher, BatcherClosed
from mtrain.serve.model import ServedModel, check_alignment_layer
from mtrain.serve.protocol import printable


@dataclasses.dataclass(frozen=True)
class Setting:
    """What a batch decodes with: requests share a batch when these are equal."""

    decode: DecodeConfig
    tgt_lang: str | None  # resolved by check_target_language (None: the model does not say)


def setting_key(setting: Setting) -> tuple:
    return dataclasses.astuple(setting.decode), setting.tgt_lang


class Lane(enum.IntEnum):
    """The batcher's lanes (each its own worker): constrained searches apart from the rest."""

    plain = 0
    constrained = 1


class Rejected(Exception):
    """A request refused with `status` and a one-line reason naming the field or limit."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def lone_surrogate(field: str, text: str) -> str | None:
    """What is wrong with `text` when it is not Unicode text (JSON can carry a lone UTF-16
    surrogate, "\\ud800", which no tokenizer or regex takes), naming `field`; None when it is text."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return (
            f"{field}: character {error.start} is a lone UTF-16 surrogate ({printable(text[error.start])}), "
            "not text; send valid Unicode (a surrogate pair, or UTF-8)"
        )
    return None


def check_controls_agree(
    terms: Sequence[tuple[str, str]],
    avoid: Sequence[str],
    constraints: Sequence[tuple[str, str]] = (),
    ignore_case: bool = False,
) -> None:
    """MtrainError (the client's 400) for a request's controls that contradict each other: a
    source term given two targets (refused by the rule a terms file's lines follow,
    `TermTargets`), or a phrase to avoid that a term's target or a (field, constraint) holds as
    whole words (the search could meet one only by breaking the other)."""
    table = TermTargets(ignore_case)
    for index, (source, target) in enumerate(terms):
        table.add(source, target, where=f"terms[{index}]", place=f"in terms[{index}]")
    required = [(f"the target term of terms[{index}]", target) for index, (_, target) in enumerate(terms)]
    required += list(constraints)
    for index, phrase in enumerate(avoid):
        words = " ".join(phrase.split())
        for name, text in required:
            if words and f" {words} " in f" {' '.join(text.split())} ":
                raise MtrainError(
                    f"avoid[{index}]: {phrase!r} is in {name} ({text!r}): a translation cannot both hold it "
                    "and avoid it; drop one of them"
                )


def server_glossary(cfg: ServeConfig) -> Glossary | None:
    """The server's `terms=FILE.tsv`, read once (its file checked before the model loaded)."""
    return read_glossary(cfg.terms, cfg.terms_ignore_case) if cfg.terms is not None else None


def served_confidence(cfg: ServeConfig) -> Confidence:
    """The confidence scores a request may ask for, read once: run='s calibration
    (`confidence.json`), else uncalibrated (an older run, an export, an ensemble: the
    calibration never saw an ensemble's log-probabilities)."""
    return run_confidence(cfg.run) if cfg.run is not None and not cfg.ensemble else Confidence()


@dataclasses.dataclass
class Served:
    """What both APIs translate with: the model, the server's settings and glossary, and what
    the constraints and terms of all requests did; `confidence`: what a request that asks for
    confidence scores gets them from."""

    model: ServedModel
    cfg: ServeConfig
    glossary: Glossary | None
    stats: PipelineStats
    confidence: Confidence = dataclasses.field(default_factory=Confidence)

    def glossary_with(self, pairs: list[tuple[str, str]] | None) -> Glossary | None:
        return glossary_of(self.glossary, pairs, self.cfg.terms_ignore_case)

    def check(self, requests: Sequence[DecodeRequest], options: Options) -> Translation:
        """The request begun (mtrain.decode.requests.pipeline.begin_translation), its sentences
        prepared for the batcher; RefusedCombination for what the rules refuse (the decoder's
        layers too), MtrainError for malformed markup (each names the field)."""
        asked = f"format={options.format}" if options.format != "text" else "alignment"
        return begin_translation(
            requests,
            options,
            ctranslate2=self.model.engine_name == "ctranslate2",
            term_aware=self.model.term_aware,
            stats=self.stats,
            check=lambda decode: check_alignment_layer(decode, self.model.decoder_layers, asked),
        )

    def check_work(self, prepared: Sequence[DecodeRequest]) -> int:
        """The constrained search's work the request asks for (source tokens x constraints,
        summed over its sentences; 0: no constraints); Rejected 413 naming the limit over
        `max_sentence_constraints` or `max_constrained_work`; MtrainError for a sentence the
        tokenizer refuses."""
        work = 0
        for sentence in prepared:
            constraints = len(sentence.constraints)
            if constraints == 0:
                continue
            if constraints > self.cfg.max_sentence_constraints:
                raise Rejected(
                    413,
                    f"max_sentence_constraints: {sentence.where} has {constraints} constraints (its terms found "
                    f"included), the limit is {self.cfg.max_sentence_constraints}; send fewer terms or constraints, "
                    "or split the sentence",
                )
            work += self.model.source_length(sentence.plain, sentence.where) * constraints
        if work > self.cfg.max_constrained_work:
            raise Rejected(
                413,
                f"max_constrained_work: the request's constrained sentences have {work} source tokens x "
                f"constraints, the limit is {self.cfg.max_constrained_work}; send fewer or shorter sentences "
                "with terms or constraints",
            )
        return work

    async def translate(
        self,
        batcher: Batcher,
        requests: Sequence[DecodeRequest],
        options: Options,
        answer: Callable[..., Any],
        invalid: int = 422,
    ) -> Any:
        """`answer(hypotheses, nbest, alignments=..., confidences=...)` for the requests, as the pipeline
        decodes them; Rejected: 422 for what the rules refuse, `invalid` (LibreTranslate: 400)
        for malformed markup or a sentence the model cannot take, as `translated` says."""
        try:
            translation = self.check(requests, options)
            lane = Lane.constrained if self.check_work(translation.requests) else Lane.plain
        except RefusedCombination as error:
            raise Rejected(422, str(error)) from None
        except MtrainError as error:
            raise Rejected(invalid, str(error)) from None
        setting = Setting(options.decoding(), options.tgt_lang)
        hypotheses = await translated(batcher, translation.requests, setting, self.cfg.request_timeout_s, invalid, lane)
        return answer(
            translation.finish(hypotheses),
            options.decode.nbest,
            alignments=options.decode.aligns,
            confidences=options.confidence is not None,
        )


async def translated(
    batcher: Batcher,
    sentences: Sequence[DecodeRequest],
    setting: Setting,
    timeout_s: float,
    invalid: int = 422,
    lane: Lane = Lane.plain,
) -> list[Any]:
    """The batcher's hypotheses for `sentences` (decoded in `lane`), or Rejected: 503 shutting
    down, 504 past `timeout_s` (its decode then stops), `invalid` (422) for an MtrainError (a
    sentence the model cannot take)."""
    try:
        future = batcher.submit(sentences, setting, lane)
    except BatcherClosed:
        raise Rejected(503, "the server is shutting down; retry on another instance") from None
    try:
        return await asyncio.wait_for(asyncio.wrap_future(future), timeout_s)
    except asyncio.TimeoutError:
        future.cancel()  # its sentences leave the queue, or their decode stops at its next step
        raise Rejected(
            504, f"request_timeout_s: not translated within {timeout_s:g} s; retry later or send fewer sentences"
        ) from None
    except MtrainError as error:
        raise Rejected(invalid, str(error)) from None
