"""What `mtrain serve` translates with: a run's engine opened once, and a batch function.

`open_served_model` opens the engine as `mtrain translate` does (`open_engine`: a torch
checkpoint, an `mtrain export` directory, or a checkpoint converted for CTranslate2), and
`ServedModel.translate` turns one batch of sentences into hypotheses the way `mtrain
translate` does: blank sentences stay empty, over-long ones are cut to `max_input_tokens`
(and the model's positions) with a warning, then `translate_encoded`. It runs on the
batcher's worker thread only, the one thread that touches the engine.

`check_target_language` is the one place a request's `tgt_lang` is judged against the
languages the model translates into (one today: the run's `data.tgt`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional, Sequence

import torch

from mtrain.config import DecodeConfig, DecodeWeights, ServeConfig
from mtrain.decode.ct2_engine import METADATA_FILE, is_export_dir
from mtrain.decode.hypothesis import Hypothesis
from mtrain.decode.translator import as_engine, translate_encoded
from mtrain.errors import MtrainError
from mtrain.model.positions import position_limit

log = logging.getLogger("mtrain.serve")


class UnknownTargetLanguage(ValueError):
    """A request's tgt_lang names a language the model does not translate into."""


@dataclass
class ServedModel:
    engine: Any  # a decoding engine (mtrain.decode.translator.Engine), built once
    tokenizer: Any
    device: torch.device
    precision: str
    description: str  # the checkpoint or export directory, its update and precision
    engine_name: str  # torch | ctranslate2
    src_lang: Optional[str]
    tgt_lang: Optional[str]
    input_limit: int  # source ids per sentence, eos included
    threads: int

    def translate(self, sentences: List[str], cfg: DecodeConfig) -> List[List[Hypothesis]]:
        """Per sentence up to `cfg.nbest` hypotheses (with `.text`), as `mtrain translate` decodes them."""
        sources = [self.encode(text) for text in sentences]
        return translate_encoded(self.engine, self.tokenizer, sources, cfg, self.device, self.precision)

    def encode(self, text: str) -> Optional[List[int]]:
        """Source ids with eos (None for a blank sentence), cut to `input_limit` with a warning."""
        if not text.strip():
            return None
        ids = self.tokenizer.encode_src(text)
        if len(ids) + 1 > self.input_limit:
            log.warning("a sentence of %d subword tokens was truncated to the first %d (max_input_tokens=%d incl. eos)",
                        len(ids), self.input_limit - 1, self.input_limit)
            ids = ids[: self.input_limit - 1]
        return ids + [self.tokenizer.eos_id]

    def target_languages(self) -> List[str]:
        """The languages a request may name in tgt_lang (besides null)."""
        return [self.tgt_lang] if self.tgt_lang else []


def check_target_language(requested: Optional[str], allowed: Sequence[str]) -> None:
    """Refuse a `tgt_lang` the model does not translate into; null means the model's own.

    A bilingual run allows its one target language; a multilingual run would list its
    languages in `allowed` (and pick the target token from `requested`).
    """
    if requested is None or requested in allowed:
        return
    choices = ", ".join(repr(language) for language in allowed)
    raise UnknownTargetLanguage(f"tgt_lang: {requested!r} is not a language this model translates into "
                                f"(allowed: {choices + ' or ' if choices else ''}null)")


def open_served_model(cfg: ServeConfig, device: torch.device, threads: int) -> ServedModel:
    """Open `cfg.run`'s engine once, as `mtrain translate` does."""
    from mtrain.export.engine import open_engine

    if cfg.run is None:
        raise MtrainError("run=RUN_DIR is missing: give the directory `mtrain fit` wrote, or an `mtrain export` "
                          "directory with engine=ctranslate2")
    # The ensemble and weights keys reach open_engine only when set, so an opener without them still serves run= alone.
    extra = {}
    if cfg.ensemble:
        extra["ensemble"] = list(cfg.ensemble)
    if cfg.weights != DecodeWeights.auto:
        extra["weights"] = cfg.weights
    opened = open_engine(cfg.run, cfg.engine, device, cfg.precision, threads, cfg.checkpoint, **extra)
    limit = cfg.max_input_tokens
    model_limit = position_limit(opened.model)
    if model_limit is not None and model_limit < limit:
        limit = model_limit  # the encoder cannot embed more positions
    src, tgt = _language_pair(cfg.run, opened.loaded)
    engine = as_engine(opened.model, opened.tokenizer, device, opened.precision)  # once: bf16 casts the weights
    return ServedModel(engine, opened.tokenizer, device, opened.precision, opened.description, str(cfg.engine),
                       src, tgt, limit, threads)


def _language_pair(run: str, loaded: Any) -> tuple[Optional[str], Optional[str]]:
    """The run's data.src/data.tgt; for an export directory, its metadata's language_pair."""
    if loaded is not None:
        return str(loaded.config.data.src), str(loaded.config.data.tgt)
    if is_export_dir(Path(run)):
        pair = json.loads((Path(run) / METADATA_FILE).read_text(encoding="utf-8")).get("language_pair", "")
        parts = str(pair).split("-")
        if len(parts) == 2 and all(parts):
            return parts[0], parts[1]
        log.warning("%s: no language pair recorded (%r); requests must leave tgt_lang null", run, pair)
    return None, None
