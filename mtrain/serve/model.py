"""What `mtrain serve` translates with: a run's engine opened once, and a batch function.

`open_served_model` opens the engine as `mtrain translate` does (`open_engine`: a torch
checkpoint, an `mtrain export` directory, or a checkpoint converted for CTranslate2), and
`ServedModel.translate` turns one batch of sentences into hypotheses by the decoder step of
the request pipeline `mtrain translate` uses (`mtrain.decode.requests.pipeline.RequestPipeline.decode`):
blank sentences stay empty, over-long ones are cut to `max_input_tokens` (and the model's
positions) with a warning; a sentence the tokenizer refuses is an MtrainError (the client's 422).
The steps around it (the rules, markup, terms, tags back) run in the request's handler. It runs on the batcher's worker threads only
(one per lane: constrained searches apart from the rest; the engine decodes under
`torch.inference_mode()` and keeps no state between calls). `ServedModel.name` is what clients are told the model
is: the run's directory name and update, never a path.

`check_target_language` is the one place a request's `tgt_lang` is judged against the
languages the model translates into: a bilingual run's `data.tgt` (null: that one), a
multilingual run's (data.lang_tags) target languages, one of which a request must name: null
is refused, as guessing a language would answer in the wrong one. Each language has its
tokenizer (its tag at the start of every source: mtrain.decode.engines.directions), made once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mtrain.config import (
    DEFAULT_ALIGNMENT_LAYER,
    AlignmentLevel,
    DecodeConfig,
    DecodeWeights,
    Engine,
    ServeConfig,
    alignment_level,
)
from mtrain.decode.engines.directions import RunLanguages
from mtrain.decode.engines.engine import as_engine
from mtrain.decode.requests.pipeline import RequestPipeline
from mtrain.decode.requests.request import DecodeRequest
from mtrain.decode.search.generator import decoder_depth
from mtrain.decode.search.hypothesis import Hypothesis
from mtrain.decoding_rules import RefusedCombination
from mtrain.errors import MtrainError
from mtrain.model.positions import position_limit

log = logging.getLogger("mtrain.serve")


class UnknownTargetLanguage(ValueError):
    """A request's tgt_lang names a language the model does not translate into."""


@dataclass
class ServedModel:
    engine: Any  # a decoding engine (mtrain.decode.translation.translator.Engine), built once
    tokenizer: Any
    device: torch.device
    precision: str
    description: str  # the checkpoint or export directory, its update and precision (for the log)
    name: str  # the run's (or export's) directory name and update, no path (for clients)
    engine_name: str  # torch | ctranslate2
    src_lang: str | None
    tgt_lang: str | None
    input_limit: int  # source ids per sentence, eos included
    threads: int
    # The tokenizer of each language a request may name (its tag first in every source);
    # empty: the model does not say what it translates into (requests leave tgt_lang null).
    tokenizers: dict[str, Any] = field(default_factory=dict)
    # Each source language and the languages it translates into (LibreTranslate's `GET /languages`):
    # the run's directions; with language tags, every source into every target (zero-shot too).
    directions: dict[str, list[str]] = field(default_factory=dict)
    # The pipeline's decoder step for this engine (built on first use).
    decoder: RequestPipeline | None = field(default=None, repr=False)
    # mtrain's model's decoder layers, which word alignments read one of (None: not known, CTranslate2's last).
    decoder_layers: int | None = None

    def translate(
        self,
        sentences: Sequence[str | DecodeRequest],
        cfg: DecodeConfig,
        tgt_lang: str | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> list[list[Hypothesis]]:
        """Per sentence up to `cfg.nbest` hypotheses (with `.text`), as `mtrain translate` decodes
        them, into `tgt_lang` (as `check_target_language` resolved it); a sentence is a request
        as the pipeline prepared it (its prefix, constraints, avoided phrases, terms), or plain
        text; `stop()`: True ends the decode at its next step (DecodeStopped: the batch's
        requests are gone)."""
        requests = [
            DecodeRequest(sentence, where="text") if isinstance(sentence, str) else sentence for sentence in sentences
        ]
        return self.pipeline().decode(requests, cfg, tgt_lang, stop=stop)

    @property
    def term_aware(self) -> bool:
        """The model reads glossary terms in its source (model.term_factors: decode.term_mode)."""
        return self.pipeline().term_aware

    def pipeline(self) -> RequestPipeline:
        """The request pipeline's decoder for this engine (one: it keeps its phrase encoders)."""
        if self.decoder is None:
            self.decoder = RequestPipeline(
                self.engine,
                self.tokenizer,
                self.device,
                self.precision,
                ctranslate2=self.engine_name == "ctranslate2",
                input_limit=self.input_limit,
                tokenizers=self.tokenizers,
            )
        return self.decoder

    def encode(self, text: str, tokenizer: Any = None) -> list[int] | None:
        """Source ids with eos (None for a blank sentence), cut to `input_limit` with a warning."""
        return self.pipeline().encode(text, tokenizer or self.tokenizer, "text")[0]

    def source_length(self, text: str, where: str = "text") -> int:
        """Source ids `text` decodes with (eos included, cut to `input_limit`; 0 for a blank
        one), as its request is checked, before it is queued: no warning (the decode gives it).
        MtrainError naming `where` for a sentence the tokenizer refuses."""
        if not text.strip():
            return 0
        try:
            pieces = len(self.tokenizer.encode_src(text))
        except Exception as error:  # the request's sentence, not the program, is at fault (as the decode says)
            raise MtrainError(
                f"{where}: a sentence the tokenizer cannot encode ({type(error).__name__}); send valid Unicode text"
            ) from error
        return min(pieces + 1, self.input_limit)

    def target_languages(self) -> list[str]:
        """The languages a request may name in tgt_lang."""
        return list(self.tokenizers)


def check_alignment_layer(decode: DecodeConfig, decoder_layers: int | None, asked: str) -> None:
    """RefusedCombination naming `asked` (`format=html`, `alignment`) when the word alignments
    it needs would read a decoder layer the model lacks (the default, the penultimate, of a
    1-layer decoder): said before decoding, with the setting that serves it."""
    if not decode.aligns or decoder_layers is None:
        return
    layer = DEFAULT_ALIGNMENT_LAYER if decode.alignment_layer is None else int(decode.alignment_layer)
    if -decoder_layers <= layer < decoder_layers:
        return
    setting = "null: the penultimate" if decode.alignment_layer is None else str(layer)
    raise RefusedCombination(
        asked,
        f"word alignments read decoder layer {layer} (decode.alignment_layer={setting}), and this model's "
        f"decoder has {decoder_layers} layer{'s' if decoder_layers != 1 else ''}; start the server with "
        "decode.alignment_layer=-1 (its last layer) to align, or send format=text without alignment",
    )


def check_target_language(requested: str | None, allowed: Sequence[str], default: str | None = None) -> str | None:
    """The language a request translates into: `requested`, one of `allowed`; null is the
    model's one language (None when the model does not say), and refused when it translates
    into several (a multilingual run)."""
    choices = ", ".join(repr(language) for language in allowed)
    if requested is None:
        if default is not None:  # (the run's one target, where the model knows more: M2M100/NLLB)
            return default
        if len(allowed) > 1:
            raise UnknownTargetLanguage(f"tgt_lang: null, but this model translates into {choices}; name one")
        return allowed[0] if allowed else None
    if requested in allowed:
        return requested
    raise UnknownTargetLanguage(
        f"tgt_lang: {requested!r} is not a language this model translates into "
        f"(allowed: {choices}{' or null' if len(allowed) <= 1 else ''})"
    )


def open_served_model(cfg: ServeConfig, device: torch.device, threads: int) -> ServedModel:
    """Open `cfg.run`'s engine once, as `mtrain translate` does."""
    from mtrain.decode.translation.alignment import resolve_alignment_source
    from mtrain.export.engine import open_engine

    if cfg.run is None:
        raise MtrainError(
            "run=RUN_DIR is missing: give the directory `mtrain fit` wrote, or an `mtrain export` directory"
        )
    # The ensemble and weights keys reach open_engine only when set, so an opener without them still serves run= alone.
    extra: dict[str, Any] = {}
    if cfg.ensemble:
        extra["ensemble"] = list(cfg.ensemble)
    if cfg.weights != DecodeWeights.auto:
        extra["weights"] = cfg.weights
    opened = open_engine(cfg.run, cfg.engine, device, cfg.precision, threads, cfg.checkpoint, **extra)
    # Where a request's alignments come from (the guided head of a run that trained one), decided
    # once whether or not the server's default asks for them: a request may.
    resolve_alignment_source(
        cfg.decode,
        opened.loaded.config if opened.loaded else None,
        opened.engine == Engine.ctranslate2,
        used=alignment_level(cfg.decode.alignment) is not AlignmentLevel.none,
    )
    limit = cfg.max_input_tokens
    model_limit = position_limit(opened.model)
    if model_limit is not None and model_limit < limit:
        limit = model_limit  # the encoder cannot embed more positions
    languages = opened.languages
    engine = as_engine(opened.model, opened.tokenizer, device, opened.precision)  # once: bf16 casts the weights
    depth = decoder_depth(opened.model) if opened.engine != Engine.ctranslate2 else None
    if languages is None:
        log.warning("%s: no language pair recorded; requests must leave tgt_lang null", cfg.run)
        return ServedModel(
            engine,
            opened.tokenizer,
            device,
            opened.precision,
            opened.description,
            served_name(cfg, opened),
            str(getattr(opened, "engine", cfg.engine)),
            None,
            None,
            limit,
            threads,
            decoder_layers=depth,
        )
    # (an M2M100/NLLB model: every language it knows, each forcing its own language token first)
    tokenizers = {tgt: opened.tokenizer_for(tgt) for tgt in languages.model_targets(opened.tokenizer)}
    # A bilingual run's pair (health); a multilingual one has no single pair: each request names its target.
    src, tgt = languages.directions()[0] if len(languages.target_languages()) == 1 else (None, None)
    if len(tokenizers) > 1:
        log.info("multilingual: translates into %s (a request names one in tgt_lang)", ", ".join(tokenizers))
    default = tokenizers[tgt] if tgt is not None else opened.tokenizer
    return ServedModel(
        engine,
        default,
        device,
        opened.precision,
        opened.description,
        served_name(cfg, opened),
        str(getattr(opened, "engine", cfg.engine)),
        src,
        tgt,
        limit,
        threads,
        tokenizers,
        served_directions(languages, list(tokenizers)),
        decoder_layers=depth,
    )


def served_name(cfg: ServeConfig, opened: Any) -> str:
    """The model as /health names it: run='s directory name (with the ensemble's size) and the
    checkpoint's update; no path reaches a client."""
    name = Path(str(cfg.run)).resolve().name
    if opened.loaded is not None:
        name += f" (update {opened.loaded.update})"
    if cfg.ensemble:
        name += f", in an ensemble with {len(cfg.ensemble)} more"
    return name


def served_directions(languages: RunLanguages, targets: Sequence[str] = ()) -> dict[str, list[str]]:
    """Source language -> the target languages a request may ask for from it; `targets`: those
    the model translates into beyond the run's (an M2M100/NLLB model's languages)."""
    directions: dict[str, list[str]] = {}
    for src, tgt in languages.directions():
        directions.setdefault(src, [])
        if languages.lang_tags:
            directions[src] = [target for target in languages.target_languages() if target != src]
        elif tgt not in directions[src]:
            directions[src].append(tgt)
    for src, served in directions.items():
        served += [target for target in targets if target != src and target not in served]
    return directions
