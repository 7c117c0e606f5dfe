#!/usr/bin/env python
"""What a decode asks of a device, per precision: operators per step and attention shapes.

Decodes the first N sentences of Multi30k test_2016_flickr (beam 5 by default) with the
benchmark-size model of `scripts/bench_decode.py` (random weights, or `--run`), in fp32 and bf16,
and counts, under a `TorchDispatchMode` (each operator once, where it reaches a device's
kernels; kinds as in `scripts/count_operators.py`):
- operators per decode step: kernels, views/metadata, casts (`_to_copy`, a kernel each), scalar
  reads (host synchronisations);
- the attention calls (`scaled_dot_product_attention`) and how many distinct input shapes
  (batch, heads, queries, keys, head_dim, mask, dtype) they had.

Why the shapes: on an H100/H200 with torch >= 2.10 and the cuDNN it bundles, sdpa sends a bf16
call with a mask to cuDNN's attention first, and cuDNN builds an execution plan for every input
shape it has not seen (tens to hundreds of ms each). A decode's shapes change at every step (the
self-attention keys grow by one, finished sentences leave the batch), so every distinct bf16
shape counted here is a plan a GPU would build (fp32 never goes to cuDNN). `--attention sdpa`
(the default) takes the branch a GPU takes; `math` the CPU's.

    python scripts/profile_decode.py --sentences 200 --threads 1
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_decode import data_dir, load, read_lines  # scripts/, on the path above
from count_operators import kind_of

from mtrain.config import AttentionImpl, DecodeConfig
from mtrain.decode.translation.translator import translate_encoded
from mtrain.model import Seq2SeqTransformer
from mtrain.model.attention import DotProductAttention


class DecodeOperators(TorchDispatchMode):
    """Counts operators by kind, as `count_operators.kind_of` sorts them, with two corrections
    for inference mode, where the composite operators reach the mode undecomposed: a `to` that
    changes the dtype is a cast (a kernel), not a view, and `item` is a scalar read."""

    def __init__(self) -> None:
        super().__init__()
        self.kinds: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        result = func(*args, **(kwargs or {}))
        name = func.name().split(".")[0]
        if name in ("aten::to", "aten::_to_copy"):
            changed = isinstance(result, torch.Tensor) and result.dtype != args[0].dtype
            self.kinds["cast" if changed else "view"] += 1
        elif name in ("aten::item", "aten::is_nonzero"):
            self.kinds["scalar read"] += 1
        else:
            self.kinds[kind_of(func)] += 1
        return result


class AttentionShapes:
    """Records the input shapes of every `F.scaled_dot_product_attention` call while active."""

    def __init__(self) -> None:
        self.calls: Counter = Counter()

    def __enter__(self) -> AttentionShapes:
        self.original = F.scaled_dot_product_attention

        def recorded(q, k, v, attn_mask=None, *args, **kwargs):  # type: ignore[no-untyped-def]
            mask = None if attn_mask is None else tuple(attn_mask.shape)
            self.calls[(tuple(q.shape), tuple(k.shape), mask, str(q.dtype))] += 1
            return self.original(q, k, v, attn_mask, *args, **kwargs)

        F.scaled_dot_product_attention = recorded
        return self

    def __exit__(self, *exc: object) -> None:
        F.scaled_dot_product_attention = self.original


class StepCounter:
    """Counts `Seq2SeqTransformer.decode_step` calls while active."""

    def __enter__(self) -> StepCounter:
        self.steps = 0
        self.original = Seq2SeqTransformer.decode_step

        def counted(model, *args, **kwargs):  # type: ignore[no-untyped-def]
            self.steps += 1
            return self.original(model, *args, **kwargs)

        Seq2SeqTransformer.decode_step = counted  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        Seq2SeqTransformer.decode_step = self.original  # type: ignore[method-assign]


def profile(model, tokenizer, sources, cfg: DecodeConfig, precision: str) -> dict:
    device = torch.device("cpu")
    translate_encoded(model, tokenizer, sources[:8], cfg, device, precision)  # warm-up
    start = time.perf_counter()
    translate_encoded(model, tokenizer, sources, cfg, device, precision)
    seconds = time.perf_counter() - start
    with StepCounter() as steps, AttentionShapes() as shapes, DecodeOperators() as operators:
        translate_encoded(model, tokenizer, sources, cfg, device, precision)
    per_step = {kind: round(calls / steps.steps, 1) for kind, calls in sorted(operators.kinds.items())}
    return {
        "precision": precision,
        "sentences_per_s": round(len(sources) / seconds, 1),
        "decode_steps": steps.steps,
        "per_step": per_step,
        "attention_calls": sum(shapes.calls.values()),
        "attention_shapes": len(shapes.calls),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", help="a run directory of `mtrain fit` (default: random benchmark-size model)")
    parser.add_argument("--checkpoint", default="best")
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--attention", default="sdpa", choices=["sdpa", "math"], help="sdpa: a GPU's branch")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--tokenizer-cache", default="~/.cache/mtrain/bench_decode_spm8k")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer, description = load(args, torch.device("cpu"))
    for module in model.modules():
        if isinstance(module, DotProductAttention):
            module.impl = AttentionImpl(args.attention)
    sources = [
        tokenizer.encode_src(line) + [tokenizer.eos_id]
        for line in read_lines(data_dir() / "test_2016_flickr.de.gz", args.sentences)
    ]
    cfg = DecodeConfig(beam=args.beam, nbest=1)
    print(f"# {description}, {len(sources)} sentences, beam {args.beam}, attention {args.attention}, cpu")
    print(
        "| precision | sent/s | steps | kernels/step (casts included) | casts/step | views/step | scalar reads/step "
        "| attention calls | distinct attention shapes |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for precision in args.precisions.split(","):
        r = profile(model, tokenizer, sources, cfg, precision)
        step = r["per_step"]
        print(
            f"| {precision} | {r['sentences_per_s']} | {r['decode_steps']} | {step.get('kernel', 0) + step.get('cast', 0):.1f} | "
            f"{step.get('cast', 0)} | {step.get('view', 0)} | {step.get('scalar read', 0)} | "
            f"{r['attention_calls']} | {r['attention_shapes']} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
