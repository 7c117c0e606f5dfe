"""Which kernel each attention call of a model runs: the GPU check's SDPA backend report.

`sdpa_backends(model, src_tokens, src_padding_mask, tgt_input)` runs one teacher-forced forward
(in the caller's autocast, the model's train/eval mode) with every `DotProductAttention` hooked.
For each call it asks torch which fused kernel `scaled_dot_product_attention` selects for exactly
those inputs (`torch._fused_sdp_choice`: flash, efficient, cuDNN or math), and which kernels
accept them, each tried alone, forward and backward, under `torch.nn.attention.sdpa_kernel`.
A call that mtrain runs with its own math attention (`model.attention_impl=math`, or `auto` on
a CPU) says so: SDPA is not called there.

On CUDA in bf16 the goal is flash or cuDNN for every call: the decoder's causal self-attention
has no mask, and encoder self-attention and cross-attention have none when the batch has no
source padding (`Batch.src_padding_mask_or_none`); with padding they take the efficient kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from mtrain.model.attention import DotProductAttention, uses_sdpa

# The kernels tried one by one, in the order a reader expects them (fastest first).
_KERNELS = (
    SDPBackend.CUDNN_ATTENTION,
    SDPBackend.FLASH_ATTENTION,
    SDPBackend.EFFICIENT_ATTENTION,
    SDPBackend.MATH,
)
MTRAIN_MATH = "mtrain math"  # the chosen kernel of a call that never reaches SDPA


@dataclass(frozen=True)
class AttentionCall:
    """One attention call of the forward: the module, its inputs, the kernel torch selects and
    the kernels that accept these inputs (forward and backward)."""

    module: str  # e.g. encoder.0.self_attn.attention
    shape: tuple[int, ...]  # the queries': (batch, heads, q_len, head_dim)
    dtype: torch.dtype
    masked: bool  # an attention mask (padding) was passed
    causal: bool
    chosen: str  # an SDPBackend name, or MTRAIN_MATH
    eligible: tuple[str, ...]


def sdpa_backends(
    model: nn.Module, src_tokens: Tensor, src_padding_mask: Tensor | None, tgt_input: Tensor
) -> list[AttentionCall]:
    """The attention calls of one forward of `model` (a Seq2SeqTransformer) on the batch, in call order."""
    captured: list[tuple[str, DotProductAttention, tuple[object, ...]]] = []
    handles = []
    for name, module in model.named_modules():
        if isinstance(module, DotProductAttention):
            handles.append(module.register_forward_hook(_capture(name, module, captured)))
    try:
        model(src_tokens, src_padding_mask, tgt_input)
    finally:
        for handle in handles:
            handle.remove()
    return [_describe(name, module, args) for name, module, args in captured]


def format_backends(calls: list[AttentionCall]) -> list[str]:
    """One line per kind of call (every layer of a kind gets the same inputs' shape and kernel)."""
    lines: dict[tuple[str, str, tuple[str, ...], bool, bool], int] = {}
    for call in calls:
        kind = _kind(call.module)
        key = (kind, call.chosen, call.eligible, call.masked, call.causal)
        lines[key] = lines.get(key, 0) + 1
    return [
        f"{kind}: {chosen} ({count} call{'s' if count > 1 else ''}; "
        f"{'padding mask' if masked else 'no mask'}{', causal' if causal else ''}; "
        f"eligible: {', '.join(eligible) or 'none'})"
        for (kind, chosen, eligible, masked, causal), count in lines.items()
    ]


def _capture(
    name: str, module: DotProductAttention, captured: list[tuple[str, DotProductAttention, tuple[object, ...]]]
) -> Callable[[nn.Module, tuple[object, ...], object], None]:
    def hook(_module: nn.Module, args: tuple[object, ...], _output: object) -> None:
        captured.append((name, module, tuple(a.detach() if isinstance(a, Tensor) else a for a in args)))

    return hook


def _describe(name: str, module: DotProductAttention, args: tuple[object, ...]) -> AttentionCall:
    q, k, v, bias, causal = args[:5]
    assert isinstance(q, Tensor) and isinstance(k, Tensor) and isinstance(v, Tensor)
    assert bias is None or isinstance(bias, Tensor)
    causal = bool(causal)
    mask = None if bias is None else bias.to(q.dtype)  # as `attend` passes it
    dropout_p = module.attention_dropout if module.training else 0.0
    if not uses_sdpa(module.impl, q):
        chosen = MTRAIN_MATH
    else:
        chosen = SDPBackend(torch._fused_sdp_choice(q, k, v, mask, dropout_p, causal)).name
    eligible = tuple(kernel.name for kernel in _KERNELS if _runs(kernel, q, k, v, mask, dropout_p, causal))
    return AttentionCall(name, tuple(q.shape), q.dtype, bias is not None, causal, chosen, eligible)


def _runs(
    kernel: SDPBackend, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float, causal: bool
) -> bool:
    """Whether SDPA runs these inputs, forward and backward, with `kernel` alone."""
    q, k, v = (t.clone().requires_grad_(True) for t in (q, k, v))
    try:
        with sdpa_kernel([kernel]):
            output = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=causal)
            output.sum().backward()
    except RuntimeError:  # "No available kernel", or a kernel that has no backward for these inputs
        return False
    return True


def _kind(module: str) -> str:
    if module.startswith("encoder"):
        return "encoder self-attention"
    if ".cross_attn." in module:
        return "cross-attention"
    return "decoder self-attention"
