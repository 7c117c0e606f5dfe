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
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

import torch
from torch import nn

from mtrain.config import DecodeConfig, Precision
from mtrain.decode.search.constraints import ControlIds
from mtrain.decode.search.generator import decoder_depth, generate
from mtrain.decode.search.hypothesis import Hypothesis
from mtrain.decode.search.steering import VocabRules, batch_processors
from mtrain.runtime import autocast, decoding_attention_kernels

if TYPE_CHECKING:
    from mtrain.decode.engines.ensemble import EnsembleModel
    from mtrain.model import Seq2SeqTransformer

ModuleT = TypeVar("ModuleT", bound=nn.Module)


def with_linear_weights_in(model: ModuleT, dtype: torch.dtype) -> ModuleT:
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

    def __init__(
        self,
        model: Seq2SeqTransformer | EnsembleModel,
        pad_id: int,
        bos_id: int,
        eos_id: int,
        device: torch.device | str,
        precision: Precision | str = Precision.fp32,
        use_cache: bool = True,
        rules: VocabRules | None = None,
    ) -> None:
        """`precision`: a resolved one (mtrain.runtime.resolve_decode_precision), not auto.
        `rules`: what the target vocabulary tells the step processors of every batch (a
        multilingual run's tags, word continuations, term placement's pieces: `VocabRules.of`)."""
        self.device = torch.device(device)
        self.precision = Precision(precision)
        if self.precision is Precision.auto:
            raise ValueError("TorchEngine needs a resolved precision: call mtrain.runtime.resolve_decode_precision")
        self.model = with_linear_weights_in(model, self.precision.dtype) if self.precision.is_low else model
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        self.use_cache = use_cache
        self.rules = rules if rules is not None else VocabRules()  # (None: no tags, no placement)
        self.depth = decoder_depth(self.model)

    def translate_batch(
        self,
        sources: Sequence[Sequence[int]],
        cfg: DecodeConfig,
        attention_layer: int | str | None = None,
        controls: Sequence[ControlIds | None] | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> list[list[Hypothesis]]:
        """Per source (ids ending in eos, none empty), up to `cfg.nbest` hypotheses, best first;
        `controls`: per source, its target prefix, constraints and avoided phrases; `stop`:
        asked at every step, True ends the decode (`generate`'s DecodeStopped)."""
        src_tokens = torch.full((len(sources), max(len(ids) for ids in sources)), self.pad_id, dtype=torch.long)
        for row, ids in enumerate(sources):
            src_tokens[row, : len(ids)] = torch.as_tensor(ids, dtype=torch.long)
        src_tokens = src_tokens.to(self.device)
        processors = batch_processors(cfg, self.rules, controls, src_tokens, self.eos_id, self.depth)
        was_training = self.model.training
        self.model.eval()  # no dropout while decoding (the trainer decodes mid-training)
        try:
            with autocast(self.device, self.precision), decoding_attention_kernels(self.device):
                return generate(
                    self.model,
                    src_tokens,
                    src_tokens.eq(self.pad_id),
                    cfg,
                    bos_id=self.bos_id,
                    eos_id=self.eos_id,
                    pad_id=self.pad_id,
                    processors=processors,
                    use_cache=self.use_cache,
                    attention_layer=attention_layer,
                    stop=stop,
                )
        finally:
            self.model.train(was_training)
