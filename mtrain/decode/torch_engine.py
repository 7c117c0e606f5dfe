"""mtrain's own model as a decoding engine: `generate` over a batch, in the chosen precision.

For bf16/fp16 the engine decodes a copy of the model whose Linear weights and biases are cast
once, and runs it under autocast (which keeps norms, softmax and the residual stream in fp32,
as in training). Autocast alone would cast every weight again at every step: its cache of
weight casts is off under `torch.inference_mode()` (which `generate` runs in), so each Linear
call cast its input, weight and bias (3 casts instead of 1; measured with the profiler on
torch 2.13 CPU). The outputs are the same: the weights are rounded as autocast rounds them.
"""

from __future__ import annotations

import copy
import itertools
from typing import Optional, Sequence

import torch
from torch import nn

from mtrain.config import DecodeConfig
from mtrain.decode.generator import generate
from mtrain.decode.hypothesis import Hypothesis
from mtrain.runtime import autocast, check_precision, cpu_has_bf16_matmul

LOW_PRECISION_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_decode_precision(name: str, device: torch.device) -> str:
    """fp32 | bf16 | fp16 | auto -> the precision decoding runs in.

    auto picks what decoded faster where it was measured (scripts/bench_decode.py, Multi30k
    test_2016_flickr, 1,000 sentences, a 3+3 layer d_model 256 run):
    - CPU with bf16 matrix instructions (AVX512-BF16 or AMX): bf16, 1.2-2.4x faster than fp32
      (1 thread, depending on the machine's load) at the same BLEU. Other CPUs emulate bf16
      products (~1 GFLOP/s): fp32.
    - CUDA: fp32. On an H200, bf16 autocast decoded 18-23x slower than fp32 (greedy 148 vs
      3,461 sent/s, beam 5 67 vs 1,240), before weights were cast once per decode (see the
      module docstring); until `scripts/bench_decode.py --devices cuda` shows bf16 at least
      as fast, auto keeps fp32 there.
    Scores and log-softmax stay fp32 either way.
    """
    check_precision(name, device)
    if name != "auto":
        return name
    if device.type == "cpu" and cpu_has_bf16_matmul():
        return "bf16"
    return "fp32"


def with_linear_weights_in(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """A copy of `model` in eval mode whose Linear weights and biases are cast to `dtype`;
    every other parameter and buffer is shared with `model`, not copied.

    A Linear tied to an embedding gets its own low-precision weight: the embedding stays fp32.
    """
    shared = {id(tensor): tensor for tensor in itertools.chain(model.parameters(), model.buffers())}
    decoding = copy.deepcopy(model, memo=shared)
    for module in decoding.modules():
        if isinstance(module, nn.Linear):
            module.weight = nn.Parameter(module.weight.detach().to(dtype), requires_grad=False)
            if module.bias is not None:
                module.bias = nn.Parameter(module.bias.detach().to(dtype), requires_grad=False)
    return decoding.eval()


class TorchEngine:
    """mtrain's model decoding with `generate` (the KV cache; `use_cache=False` recomputes
    the prefix every step: reference and benchmark)."""

    def __init__(self, model: nn.Module, pad_id: int, bos_id: int, eos_id: int, device: torch.device | str,
                 precision: str = "fp32", use_cache: bool = True) -> None:
        self.device = torch.device(device)
        self.precision = resolve_decode_precision(precision, self.device)
        dtype = LOW_PRECISION_DTYPES.get(self.precision)
        self.model = model if dtype is None else with_linear_weights_in(model, dtype)
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        self.use_cache = use_cache

    def translate_batch(self, sources: Sequence[Sequence[int]], cfg: DecodeConfig,
                        attention_layer: Optional[int | str] = None) -> list[list[Hypothesis]]:
        """Per source (ids ending in eos, none empty), up to `cfg.nbest` hypotheses, best first."""
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
