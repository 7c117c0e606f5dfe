"""Sentences in, translations out: encode, batch by a token budget, decode, detokenize.

Sentences are sorted by source length so a batch wastes little on padding, packed until
`sentences x longest source` would exceed `DecodeConfig.max_tokens`, decoded with
`generate`, and put back in input order. An empty (or blank) sentence is not decoded: it
gets an empty hypothesis. The trainer's validation BLEU and `mtrain translate` both come
through here.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch

from mtrain.config import DecodeConfig
from mtrain.decode.generator import generate
from mtrain.decode.hypothesis import Hypothesis
from mtrain.errors import MtrainError
from mtrain.train.runtime import autocast

PRECISIONS = ("auto", "fp32", "bf16", "fp16")


def resolve_decode_precision(name: str, device: torch.device) -> str:
    """'auto' -> bf16 on CUDA GPUs that support it (fp16 on older ones), fp32 on CPU.

    On CPU, auto stays fp32: bf16 autocast did not decode faster on this project's CPUs
    (AVX512-BF16 without AMX; scripts/bench_decode.py) and changes outputs slightly.
    """
    if name not in PRECISIONS:
        raise MtrainError(f"precision={name!r}: choose one of {'|'.join(PRECISIONS)}")
    if name == "fp16" and device.type != "cuda":
        raise MtrainError("precision=fp16 needs a CUDA device; use bf16 or fp32 on CPU")
    if name != "auto":
        return name
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "fp32"


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
    """
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
    for batch in token_budget_batches(lengths, cfg.max_tokens):
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
