"""Forward+backward time of the benchmark-size model: sdpa vs math attention, fp32 vs bf16
autocast, dropout 0.1 (mtrain's cheap mask, or torch's F.dropout) vs 0.

    OMP_NUM_THREADS=2 .venv/bin/python scripts/bench_attention.py [--rounds 2] [--tokens 3000]
    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_attention.py --encoder-attention --threads 1

`--encoder-attention` times one encoder self-attention (projections, attention, output
projection; forward+backward) instead, on the same batch with its source padding masked (an
additive bias, as before issue 61) and on a batch of the same shape without padding, masked
with an all-zero bias (as before) or given no mask (`Batch.src_padding_mask_or_none`: what
lets SDPA take the flash kernel on CUDA), for sdpa and math attention in fp32 and bf16.

The model is the CPU benchmark's: 3+3 layers, d_model 256, 4 heads, FFN 1024, an 8k joint
vocabulary, tied embeddings. Batches are synthetic but shaped like Multi30k's: sentences of
12..18 tokens padded to the longest (as length-bucketed batching gives), `--tokens` target
tokens per batch; the loss is the trainer's (fp32 label-smoothed cross-entropy).

Every setting gets its own model; settings are timed in interleaved rounds and the best
round is reported, because the machine is shared and slow rounds are other people's work.
Prints a markdown table: wall ms per step, target tokens per second, and the process CPU
time per step (with one thread, the least disturbed measure on a busy machine). About a
minute or two.
"""

from __future__ import annotations

import argparse
import itertools
import time
from contextlib import nullcontext

import torch
import torch.nn.functional as F

import mtrain.model.dropout as dropout_module
from mtrain.config import ModelConfig
from mtrain.model import build_model
from mtrain.model.attention import SelfAttention, padding_bias

VOCAB, PAD = 8000, 1
OWN_DROPOUT = (dropout_module._Dropout, dropout_module._DropoutAdd)


class _TorchDropout:
    """Stands in for mtrain's dropout to time torch's F.dropout inside the same model."""

    @staticmethod
    def apply(y: torch.Tensor, p: float) -> torch.Tensor:
        return F.dropout(y, p, training=True)


class _TorchDropoutAdd:
    @staticmethod
    def apply(x: torch.Tensor, y: torch.Tensor, p: float) -> torch.Tensor:
        return x + F.dropout(y, p, training=True)


def make_batch(tokens: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    """src_tokens, src_padding_mask, tgt_input, tgt_output for ~`tokens` target tokens."""
    lengths = torch.randint(12, 19, (tokens // 15,), generator=generator)
    batch, src_len = len(lengths), int(lengths.max())
    src_padding_mask = torch.arange(src_len)[None, :] >= lengths[:, None]
    src = torch.randint(4, VOCAB, (batch, src_len), generator=generator).masked_fill(src_padding_mask, PAD)
    tgt = torch.randint(4, VOCAB, (batch, src_len + 1), generator=generator)
    tgt = tgt.masked_fill(torch.arange(src_len + 1)[None, :] > lengths[:, None], PAD)
    return src, src_padding_mask, tgt[:, :-1], tgt[:, 1:]


class Setting:
    def __init__(self, impl: str, precision: str, dropout: float, torch_dropout: bool):
        self.impl, self.precision, self.dropout, self.torch_dropout = impl, precision, dropout, torch_dropout
        torch.manual_seed(0)
        cfg = ModelConfig(dropout=dropout, attention_impl=impl)
        self.model = build_model(cfg, VOCAB, VOCAB, PAD, joint_vocab=True).train()
        self.best = float("inf")
        self.best_cpu = float("inf")

    def step(self, batch: tuple[torch.Tensor, ...]) -> None:
        """One forward+backward; keeps the fastest time seen."""
        src, src_padding_mask, tgt_input, tgt_output = batch
        if self.torch_dropout:
            dropout_module._Dropout, dropout_module._DropoutAdd = _TorchDropout, _TorchDropoutAdd
        autocast = torch.autocast("cpu", dtype=torch.bfloat16) if self.precision == "bf16" else nullcontext()
        start, start_cpu = time.perf_counter(), time.process_time()
        with autocast:
            logits = self.model(src, src_padding_mask, tgt_input)
        loss = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(),
            tgt_output.reshape(-1),
            ignore_index=PAD,
            reduction="sum",
            label_smoothing=0.1,
        )
        loss.backward()
        self.best = min(self.best, time.perf_counter() - start)
        self.best_cpu = min(self.best_cpu, time.process_time() - start_cpu)
        self.model.zero_grad(set_to_none=True)
        dropout_module._Dropout, dropout_module._DropoutAdd = OWN_DROPOUT

    def label(self) -> str:
        if not self.dropout:
            return "0"
        return f"{self.dropout} ({'F.dropout' if self.torch_dropout else 'mtrain'})"


class EncoderAttention:
    """One encoder self-attention, timed forward+backward with one way of masking."""

    MASKS = ("padded batch, bias", "no padding, zero bias", "no padding, no mask")

    def __init__(self, impl: str, precision: str, mask: str):
        self.impl, self.precision, self.mask = impl, precision, mask
        torch.manual_seed(0)
        self.attention = SelfAttention(256, 4, 0.1, impl, None).train()  # type: ignore[arg-type]
        self.best = self.best_cpu = float("inf")

    def step(self, x: torch.Tensor, src_padding_mask: torch.Tensor) -> None:
        if self.mask == self.MASKS[0]:
            bias = padding_bias(src_padding_mask)
        elif self.mask == self.MASKS[1]:
            bias = padding_bias(torch.zeros_like(src_padding_mask))
        else:
            bias = None
        autocast = torch.autocast("cpu", dtype=torch.bfloat16) if self.precision == "bf16" else nullcontext()
        x = x.detach().requires_grad_(True)
        start, start_cpu = time.perf_counter(), time.process_time()
        with autocast:
            output = self.attention(x, bias=bias)
        output.float().sum().backward()
        self.best = min(self.best, time.perf_counter() - start)
        self.best_cpu = min(self.best_cpu, time.process_time() - start_cpu)
        self.attention.zero_grad(set_to_none=True)


def encoder_attention(args: argparse.Namespace, batch: tuple[torch.Tensor, ...]) -> None:
    src_padding_mask = batch[1]
    x = torch.randn(*src_padding_mask.shape, 256, generator=torch.Generator().manual_seed(1))
    settings = [
        EncoderAttention(impl, precision, mask)
        for impl, precision, mask in itertools.product(("sdpa", "math"), ("fp32", "bf16"), EncoderAttention.MASKS)
    ]
    for _ in range(args.rounds + 1):
        for setting in settings:
            setting.step(x, src_padding_mask)
    print(
        f"encoder self-attention, {x.shape[0]} sentences x {x.shape[1]} positions, d_model 256, 4 heads, "
        f"dropout 0.1; {args.threads} threads; best of {args.rounds} rounds after a warm-up"
    )
    print("| attention | precision | batch, mask | ms fwd+bwd | CPU ms |")
    print("|---|---|---|---:|---:|")
    for s in settings:
        print(f"| {s.impl} | {s.precision} | {s.mask} | {s.best * 1000:.2f} | {s.best_cpu * 1000:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds after one warm-up")
    parser.add_argument("--tokens", type=int, default=3000, help="target tokens per batch")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--encoder-attention", action="store_true", help="time one encoder self-attention")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    batch = make_batch(args.tokens, torch.Generator().manual_seed(0))
    if args.encoder_attention:
        encoder_attention(args, batch)
        return
    target_tokens = int((batch[3] != PAD).sum())
    settings = [
        Setting(impl, precision, dropout, False)
        for impl, precision, dropout in itertools.product(("sdpa", "math"), ("fp32", "bf16"), (0.1, 0.0))
    ]
    settings += [Setting("math", precision, 0.1, True) for precision in ("fp32", "bf16")]
    for _ in range(args.rounds + 1):
        for setting in settings:
            setting.step(batch)
    print(
        f"batch: {batch[0].shape[0]} sentences, src_len {batch[0].shape[1]}, {target_tokens} target "
        f"tokens; {args.threads} threads; best of {args.rounds} rounds after a warm-up"
    )
    print("| attention | precision | dropout | ms/step | target tok/s | CPU ms/step |")
    print("|---|---|---|---:|---:|---:|")
    for s in settings:
        print(
            f"| {s.impl} | {s.precision} | {s.label()} | {s.best * 1000:.0f} | "
            f"{target_tokens / s.best:,.0f} | {s.best_cpu * 1000:.0f} |"
        )


if __name__ == "__main__":
    main()
