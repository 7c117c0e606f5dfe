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

An engine (`Engine`) decodes one batch: `TorchEngine` (mtrain's own model, `generate`) or
CTranslate2 (`mtrain.decode.ct2_engine.CTranslate2Model`, `engine=ctranslate2`).
"""

from __future__ import annotations

from typing import Callable, Optional, Protocol, Sequence, runtime_checkable

import torch

from mtrain.config import DecodeConfig
from mtrain.decode.generator import generate
from mtrain.decode.hypothesis import Hypothesis
from mtrain.runtime import autocast, check_precision, cpu_has_bf16_matmul


@runtime_checkable
class Engine(Protocol):
    """Decodes one batch of encoded sources."""

    def translate_batch(self, sources: Sequence[Sequence[int]], cfg: DecodeConfig,
                        attention_layer: Optional[int | str] = None) -> list[list[Hypothesis]]:
        """Per source (ids ending in eos, none empty), up to `cfg.nbest` hypotheses, best
        first, without `.text` (the translator detokenizes)."""
        ...


def resolve_decode_precision(name: str, device: torch.device) -> str:
    """fp32 | bf16 | fp16 | auto -> the precision decoding runs in (autocast for bf16/fp16).

    auto picks what decoded faster where it was measured (scripts/bench_decode.py, Multi30k
    test_2016_flickr, 1,000 sentences, a 3+3 layer d_model 256 run):
    - CPU with bf16 matrix instructions (AVX512-BF16 or AMX): bf16, 1.6-2.4x faster than fp32
      (1 thread, depending on the machine's load) at the same BLEU (28.03 vs 27.92 greedy,
      28.76 vs 28.71 beam 5). Other CPUs emulate bf16 products (~1 GFLOP/s): fp32.
    - CUDA: fp32. On an H200, bf16 autocast decoded 18-23x slower than fp32 (greedy 148 vs
      3,461 sent/s, beam 5 67 vs 1,240): decoding a small model is bound by kernel launches
      and host synchronisations, not by matrix products, and autocast adds a cast kernel per
      product input per step. bf16 is one `precision=bf16` away when a GPU measurement
      (`scripts/bench_decode.py --devices cuda`) says it has caught up.
    Scores and log-softmax stay fp32 either way.
    """
    check_precision(name, device)
    if name != "auto":
        return name
    if device.type == "cpu" and cpu_has_bf16_matmul():
        return "bf16"
    return "fp32"


class TorchEngine:
    """mtrain's model decoding with `generate` (the KV cache; `use_cache=False` recomputes
    the prefix every step: reference and benchmark)."""

    def __init__(self, model, pad_id: int, bos_id: int, eos_id: int, device: torch.device | str,
                 precision: str = "fp32", use_cache: bool = True) -> None:
        self.model = model
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        self.device = torch.device(device)
        self.precision = resolve_decode_precision(precision, self.device)
        self.use_cache = use_cache

    def translate_batch(self, sources: Sequence[Sequence[int]], cfg: DecodeConfig,
                        attention_layer: Optional[int | str] = None) -> list[list[Hypothesis]]:
        src_tokens = torch.full((len(sources), max(len(ids) for ids in sources)), self.pad_id, dtype=torch.long)
        for row, ids in enumerate(sources):
            src_tokens[row, : len(ids)] = torch.as_tensor(ids, dtype=torch.long)
        src_tokens = src_tokens.to(self.device)
        was_training = self.model.training
        self.model.eval()  # no dropout while decoding (the trainer decodes mid-training)
        try:
            with autocast(self.device, self.precision):
                return generate(
                    self.model, src_tokens, src_tokens.eq(self.pad_id), cfg,
                    bos_id=self.bos_id, eos_id=self.eos_id, pad_id=self.pad_id,
                    use_cache=self.use_cache, attention_layer=attention_layer,
                )
        finally:
            self.model.train(was_training)


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
    model,
    tokenizer,
    sources: Sequence[Optional[Sequence[int]]],
    cfg: DecodeConfig,
    device: torch.device | str,
    precision: str = "fp32",
    attention_layer: Optional[int | str] = None,
    use_cache: bool = True,
    on_batch: Optional[Callable[[int], None]] = None,
) -> list[list[Hypothesis]]:
    """Translate encoded sources (ids ending in eos; None for an empty input).

    `model` is mtrain's model (decoded by a `TorchEngine` on `device` in `precision`) or
    an `Engine` (e.g. CTranslate2's, which brings its own device and compute type).
    Returns, per source, up to `cfg.nbest` hypotheses with `.text` filled, best first.
    `attention_layer` (None, "last", "all" or an index) fills `Hypothesis.attention`.
    `on_batch(num_sentences)` is called after each batch (progress bars).
    """
    engine = model if isinstance(model, Engine) else TorchEngine(
        model, tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id, device, precision, use_cache)
    results: list[list[Hypothesis]] = [[Hypothesis(tokens=[], score=0.0)] for _ in sources]
    to_decode = [i for i, ids in enumerate(sources) if ids]
    hypotheses = cfg.beam if cfg.sampling == "none" else cfg.nbest
    lengths = [len(sources[i]) for i in to_decode]
    for batch in token_budget_batches(lengths, max(1, cfg.max_tokens // hypotheses)):
        indices = [to_decode[j] for j in batch]
        for i, sentence_hyps in zip(indices, engine.translate_batch([sources[i] for i in indices], cfg, attention_layer)):
            for hyp in sentence_hyps:
                hyp.text = tokenizer.decode_tgt(hyp.tokens)
            results[i] = sentence_hyps
        if on_batch is not None:
            on_batch(len(indices))
    return results


def translate_sentences(
    model,
    tokenizer,
    sentences: Sequence[str],
    cfg: DecodeConfig,
    device: torch.device | str,
    precision: str = "fp32",
) -> list[list[Hypothesis]]:
    """Translate raw sentences; per sentence up to `cfg.nbest` hypotheses (with `.text`)."""
    sources = [tokenizer.encode_src(s) + [tokenizer.eos_id] if s.strip() else None for s in sentences]
    return translate_encoded(model, tokenizer, sources, cfg, device, precision)
