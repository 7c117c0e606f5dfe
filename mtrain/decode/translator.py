"""Sentences in, translations out: encode, batch by a token budget, decode, detokenize.

Sentences are sorted by source length so a batch wastes little on padding, packed until
`sentences x hypotheses per sentence x longest source` would exceed `DecodeConfig.max_tokens`,
decoded with `generate`, and put back in input order. Counting hypotheses (beam or nbest
samples) bounds the cross-attention keys/values the decoder carries and copies at each beam
step: with beam 5 on the CPU, 1,600 source tokens per batch decoded 1.1-1.5x faster than
8,000 (fp32 and bf16, four runs on the shared machine), with the same outputs
(scripts/bench_decode.py, 1,000 Multi30k sentences, 1 thread); greedy decoding (one row
per sentence) is unchanged. An empty (or
blank) sentence is not decoded: it gets an empty hypothesis. The trainer's validation BLEU
and `mtrain translate` both come through here.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch

from mtrain.config import DecodeConfig
from mtrain.decode.ct2_engine import CTranslate2Model
from mtrain.decode.generator import generate
from mtrain.decode.hypothesis import Hypothesis
from mtrain.train.runtime import autocast, resolve_precision

def resolve_decode_precision(name: str, device: torch.device) -> str:
    """fp32 | bf16 | fp16 | auto -> the precision decoding runs in (autocast for bf16/fp16).

    auto is bf16 on GPUs that have it (else fp16) and on CPUs with bf16 matrix
    instructions (AVX512-BF16 or AMX), else fp32: the same rule as training. Measured with
    scripts/bench_decode.py on Multi30k test_2016_flickr (1,000 sentences, a 3+3 layer
    d_model 256 run, 1 CPU thread, AVX512-BF16 without AMX): bf16 decoded 1.6-2.4x faster
    than fp32 (depending on the machine's load) at the same BLEU (28.03 vs 27.92 greedy,
    28.76 vs 28.71 beam 5). Scores and log-softmax stay fp32 either way.
    """
    return resolve_precision(name, device)


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

    Returns, per source, up to `cfg.nbest` hypotheses with `.text` filled, best first.
    `attention_layer` (None, "last", "all" or an index) fills `Hypothesis.attention`.
    `on_batch(num_sentences)` is called after each batch (progress bars).
    `model` may be a `CTranslate2Model` (engine=ctranslate2), which decodes by itself.
    """
    if isinstance(model, CTranslate2Model):
        return model.translate_encoded(sources, cfg, attention_layer, on_batch)
    device = torch.device(device)
    precision = resolve_decode_precision(precision, device)
    results: list[list[Hypothesis]] = [[Hypothesis(tokens=[], score=0.0)] for _ in sources]
    to_decode = [i for i, ids in enumerate(sources) if ids]
    lengths = [len(sources[i]) for i in to_decode]
    pad_id = tokenizer.pad_id
    was_training = model.training
    model.eval()  # no dropout while decoding (the trainer calls this mid-training)
    try:
        _decode_batches(model, tokenizer, sources, to_decode, lengths, cfg, device, precision,
                        attention_layer, use_cache, on_batch, results)
    finally:
        model.train(was_training)
    return results


def _decode_batches(model, tokenizer, sources, to_decode, lengths, cfg, device, precision,
                    attention_layer, use_cache, on_batch, results) -> None:
    pad_id = tokenizer.pad_id
    hypotheses = cfg.beam if cfg.sampling == "none" else cfg.nbest
    for batch in token_budget_batches(lengths, max(1, cfg.max_tokens // hypotheses)):
        indices = [to_decode[j] for j in batch]
        src_len = max(len(sources[i]) for i in indices)
        src_tokens = torch.full((len(indices), src_len), pad_id, dtype=torch.long)
        for row, i in enumerate(indices):
            src_tokens[row, : len(sources[i])] = torch.as_tensor(sources[i], dtype=torch.long)
        src_tokens = src_tokens.to(device)
        src_padding_mask = src_tokens.eq(pad_id)
        with autocast(device, precision):
            hyps = generate(
                model, src_tokens, src_padding_mask, cfg,
                bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id, pad_id=pad_id,
                use_cache=use_cache, attention_layer=attention_layer,
            )
        for i, sentence_hyps in zip(indices, hyps):
            for hyp in sentence_hyps:
                hyp.text = tokenizer.decode_tgt(hyp.tokens)
            results[i] = sentence_hyps
        if on_batch is not None:
            on_batch(len(indices))


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
