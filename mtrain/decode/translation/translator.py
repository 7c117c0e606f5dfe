"""Sentences in, translations out: encode, batch by a token budget, decode, detokenize.

One batcher for every engine: sentences are sorted by source length so a batch wastes little
on padding, packed until `sentences x hypotheses per sentence x longest source` would exceed
`DecodeConfig.max_tokens`, handed to the engine, and put back in input order. Counting
hypotheses (beam or nbest samples) bounds what the decoder carries at each beam step: with
beam 5 on the CPU, 1,600 source tokens per batch decoded 1.1-1.5x faster than 8,000 (fp32
and bf16, four runs on the shared machine), with the same outputs (scripts/bench_decode.py,
1,000 Multi30k sentences, 1 thread); greedy decoding (one row per sentence) is unchanged.
An empty (or blank) sentence is not decoded: it gets an empty hypothesis. The trainer's
validation BLEU, `mtrain eval` and `mtrain translate` all come through here.

An engine (`Engine`, `engines/engine.py`) decodes one batch: `TorchEngine` (mtrain's own
model, `generate`; `engines/torch_engine.py`) or CTranslate2 (`engines/ct2_engine.py`,
`engine=ctranslate2`); with MBR or reranking, a `SelectingEngine` around it
(`selection/selecting.py`). Requests (markup, controls, terms) reach this module through the
request pipeline (`requests/pipeline.py`, the layer above).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from mtrain.config import DecodeConfig, Precision, to_typed
from mtrain.decode.engines.engine import Engine, as_engine
from mtrain.decode.engines.torch_engine import TorchEngine
from mtrain.decode.search.constraints import ControlIds
from mtrain.decode.search.generator import DecodeStopped
from mtrain.decode.search.hypothesis import Hypothesis
from mtrain.decode.selection.selecting import decoded_per_sentence, selecting
from mtrain.decode.translation.alignment import Aligner
from mtrain.tokenizer import Tokenizer

if TYPE_CHECKING:
    from mtrain.decode.engines.ensemble import EnsembleModel
    from mtrain.model import Seq2SeqTransformer

__all__ = ["Engine", "as_engine", "token_budget_batches", "translate_encoded", "translate_sentences"]


def token_budget_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Indices grouped so that `len(batch) * max(length in batch) <= max_tokens`.

    Longest first (an out-of-memory batch shows up at once); a sentence longer than the
    budget gets a batch of its own.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        longest = lengths[current[0]] if current else lengths[i]
        if current and (len(current) + 1) * longest > max_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def translate_encoded(
    model: Seq2SeqTransformer | EnsembleModel | Engine,
    tokenizer: Tokenizer,
    sources: Sequence[Sequence[int] | None],
    cfg: DecodeConfig,
    device: torch.device | str,
    precision: Precision | str = Precision.fp32,
    attention_layer: int | str | None = None,
    use_cache: bool = True,
    on_batch: Callable[[int], object] | None = None,
    controls: Sequence[ControlIds | None] | None = None,
    stop: Callable[[], bool] | None = None,
) -> list[list[Hypothesis]]:
    """Translate encoded sources (ids ending in eos; None for an empty input).

    `model` is mtrain's model (decoded by a `TorchEngine` on `device` in `precision`) or
    an `Engine` (e.g. CTranslate2's, which brings its own device and compute type).
    Returns, per source, up to `cfg.nbest` hypotheses with `.text` filled, best first.
    `attention_layer` (None, "last", "all" or an index) fills `Hypothesis.attention`;
    `cfg.alignment` fills `Hypothesis.alignment` (mtrain.decode.translation.alignment).
    `on_batch(num_sentences)` is called after each batch (progress bars).
    `controls`: per source, its target prefix, constraints and avoided phrases (target ids,
    `mtrain.decode.search.constraints`); None: none. An empty input with a prefix gets the prefix.
    `stop()`: True ends the decode with DecodeStopped (mtrain.decode.search.generator), asked before
    every batch and, by mtrain's own engine, at every step of its search.
    """
    cfg = to_typed(cfg)  # (a composed node, from a test or script, as the dataclass whose predicates it reads)
    if tokenizer.target_prefix:  # M2M100/NLLB: the target language's token first (forced_bos_token_id)
        controls = with_target_prefix(controls, len(sources), tokenizer.target_prefix)
    # MBR decoding and reranking (mtrain.decode.selection.selecting), when asked: a decorator of the engine.
    engine = selecting(as_engine(model, tokenizer, device, precision, use_cache), tokenizer, cfg, device)
    aligner = Aligner.of(cfg, tokenizer, attention_layer)
    if aligner is not None:
        attention_layer = aligner.attention_layer  # what decoding collects (pictures included)
    no_links: list[tuple[int, int]] | None = None if aligner is None else []  # a blank line's alignment
    results: list[list[Hypothesis]] = [[Hypothesis(tokens=[], score=0.0, alignment=no_links)] for _ in sources]
    if controls is not None:
        for i, (ids, control) in enumerate(zip(sources, controls, strict=True)):
            if not ids and control is not None and control.prefix:  # nothing to translate: the prefix as typed
                results[i] = [
                    Hypothesis(list(control.prefix), 0.0, text=tokenizer.decode_tgt(control.prefix), alignment=no_links)
                ]
    to_decode = [i for i, ids in enumerate(sources) if ids]
    hypotheses = decoded_per_sentence(cfg)
    lengths = [len(sources[i] or ()) for i in to_decode]  # (`or ()` for the type checker: none is None)
    # Only mtrain's own engine asks `stop` at every step; the others are stopped between batches.
    per_step: dict[str, Any] = {"stop": stop} if stop is not None and isinstance(engine, TorchEngine) else {}
    for batch in token_budget_batches(lengths, max(1, cfg.max_tokens // hypotheses)):
        if stop is not None and stop():
            raise DecodeStopped(f"stopped before a batch of {len(batch)} sentences")
        indices = [to_decode[j] for j in batch]
        batch_sources = [sources[i] or () for i in indices]
        batch_controls = [controls[i] for i in indices] if controls is not None else None
        if batch_controls is not None and all(c is None or c.empty for c in batch_controls):
            batch_controls = None  # (an engine without the keyword decodes such batches too)
        if batch_controls is None:
            decoded = engine.translate_batch(batch_sources, cfg, attention_layer, **per_step)
        else:
            decoded = engine.translate_batch(batch_sources, cfg, attention_layer, controls=batch_controls, **per_step)
        for i, sentence_hyps in zip(indices, decoded, strict=True):
            for hyp in sentence_hyps:
                if not hyp.text:  # (a selecting engine has detokenized its hypotheses already)
                    hyp.text = tokenizer.decode_tgt(hyp.tokens)
                if aligner is not None:
                    aligner.align(sources[i] or (), hyp)
            results[i] = sentence_hyps
        if on_batch is not None:
            on_batch(len(indices))
    return results


def translate_sentences(
    model: Seq2SeqTransformer | EnsembleModel | Engine,
    tokenizer: Tokenizer,
    sentences: Sequence[str],
    cfg: DecodeConfig,
    device: torch.device | str,
    precision: Precision | str = Precision.fp32,
    on_batch: Callable[[int], None] | None = None,
) -> list[list[Hypothesis]]:
    """Translate raw sentences; per sentence up to `cfg.nbest` hypotheses (with `.text`).
    `on_batch(num_sentences)` is called after each batch (progress)."""
    sources = [tokenizer.encode_src(s) + [tokenizer.eos_id] if s.strip() else None for s in sentences]
    return translate_encoded(model, tokenizer, sources, cfg, device, precision, on_batch=on_batch)


def with_target_prefix(
    controls: Sequence[ControlIds | None] | None, count: int, target_prefix: Sequence[int]
) -> list[ControlIds | None]:
    """`controls` with `target_prefix` before each sentence's own prefix: the tokens a model
    emits first whatever the sentence (an M2M100/NLLB model's target-language token)."""
    given = list(controls) if controls is not None else [None] * count
    forced = tuple(int(i) for i in target_prefix)
    return [
        replace(control, prefix=forced + control.prefix, unscored=len(forced))
        if control is not None
        else ControlIds(prefix=forced, unscored=len(forced))
        for control in given
    ]
