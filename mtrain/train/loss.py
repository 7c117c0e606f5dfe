"""Label-smoothed cross-entropy over target tokens, fused with the output projection.

The training objective never materialises the (tokens, vocab) logits of a whole batch: the
output projection, log-softmax, loss and both gradients are computed chunk by chunk of
target rows (`_FusedOutputLoss`), and only the non-pad rows are projected at all. On a CPU a
chunk's logits stay in cache; on a GPU the largest activation of the model (a 32k vocabulary
x 16k tokens is 2 GiB in fp32) shrinks to one chunk.

`TranslationLoss` puts the model and this loss in one module: what DDP and `torch.compile`
wrap, so that every parameter's gradient is produced inside the wrapped forward. With guided
alignment (`train.guided_alignment`; Garg et al. 2019) it adds `weight` times the
cross-entropy between one cross-attention head's rows and the batch's normalised alignment
rows (`alignment_loss`), summed over the aligned target tokens as the translation loss is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from mtrain.model import Seq2SeqTransformer

# Logits elements per chunk: 256 rows x 8k vocabulary (8 MiB fp32) stays in a CPU's L3
# cache; a GPU takes 32M elements (128 MiB) at a time, few launches per batch.
_CPU_CHUNK_ELEMENTS = 1 << 21
_GPU_CHUNK_ELEMENTS = 1 << 25
# ... but never fewer rows than this per chunk: each chunk reads the whole output matrix, so with
# a large vocabulary (NLLB's 256k rows: 8 rows a chunk, the 1 GB matrix read 128 times for 1,024
# targets) the products turned memory-bound: a full-vocabulary NLLB-shaped update ran at 0.36x a
# plain transformers loop on the same batches (scripts/bench_vocab_trim.py --transformers).
# Up to 8k-piece vocabularies (the CPU presets) the budget already gives 256 rows or more.
_MIN_CHUNK_ROWS = 256


def _chunk_count(rows: int, vocab: int, like: Tensor, static_rows: bool) -> int:
    """How many row chunks keep one chunk's logits within the device's budget. Compiled, the
    rows are the non-pad targets, whose count changes every batch: a chunk count computed from
    it would make torch.compile specialise on every token count (a recompile per batch), so that
    takes one chunk. With `static_rows` (every target position, weighted: compiled per batch
    shape, mtrain.train.compilation) the rows are a constant of each graph, and so is the count."""
    if torch.compiler.is_compiling() and not static_rows:
        return 1
    budget = _GPU_CHUNK_ELEMENTS if like.is_cuda else _CPU_CHUNK_ELEMENTS
    rows_per_chunk = max(_MIN_CHUNK_ROWS, budget // vocab)
    return max(1, -(-rows // rows_per_chunk))


class _FusedOutputLoss(torch.autograd.Function):
    """Summed label-smoothed loss and NLL of `hidden @ weight[vocab].T`, gradients computed in forward.

    The loss is the last node of the graph, so its gradient with respect to the scalar loss
    is known in the forward pass: d loss / d logits = softmax - q, with the target
    distribution q = (1 - eps) onehot + eps / V. Each chunk's softmax goes straight into the
    two gradient products (d hidden = G W, d weight += G^T hidden) and is dropped; backward
    only scales the stored gradients by the incoming one. The constant parts of q never touch
    the (rows, vocab) chunk: they are a column sum of W, a row sum of hidden and W[targets].
    Matrix products run in `compute_dtype` (autocast's), softmax and accumulation in fp32.

    `vocab_ids` (ascending), when given, are the rows of `weight` the softmax ranges over (a
    restricted output vocabulary; V is their count); the other rows get no logits and, but
    for a target's own row, no gradient. `row_weights` (rows,), when given, is 1 at the rows
    that count and 0 at those that do not (padding, projected only to keep shapes static):
    a row of weight 0 adds nothing to the loss nor to any gradient. `bias` (the rows of
    `weight`,), when given, is added to the logits (`model.output_bias`); its gradient is the
    column sum of softmax - q, accumulated in fp32 beside the weight's.
    """

    @staticmethod
    def forward(
        ctx: Any,
        hidden: Tensor,
        weight: Tensor,
        targets: Tensor,
        vocab_ids: Tensor | None,
        label_smoothing: float,
        compute_dtype: torch.dtype,
        row_weights: Tensor | None = None,
        bias: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        rows = hidden.shape[0]
        needs_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        if row_weights is not None:  # rows of zeros: no logit, no contribution to the weight's gradient
            hidden = hidden * row_weights[:, None].to(hidden.dtype)
        h = hidden.to(compute_dtype)
        w = weight.to(compute_dtype)
        softmax_weight = w if vocab_ids is None else w.index_select(0, vocab_ids)
        vocab = softmax_weight.shape[0]
        h32 = h.float()  # the operands as the products see them, in fp32
        target_weights = w.index_select(0, targets).float()  # (rows, d)
        target_logits = (h32 * target_weights).sum(-1)
        # A zero-weight row's logits are the bias alone: its bias terms are weighted 0 as well.
        counted = torch.ones(rows, device=hidden.device) if row_weights is None else row_weights.float()
        softmax_bias = grad_softmax_bias = None
        if bias is not None:
            bias32 = bias.float()
            softmax_bias = bias32 if vocab_ids is None else bias32.index_select(0, vocab_ids)
            target_logits = target_logits + bias32.index_select(0, targets) * counted
            if needs_grad:
                grad_softmax_bias = torch.zeros(vocab, device=weight.device, dtype=torch.float32)
        grad_softmax_weight = (
            torch.zeros(softmax_weight.shape, device=weight.device, dtype=torch.float32) if needs_grad else None
        )
        log_normalisers, grad_hiddens = [], []
        chunks = _chunk_count(rows, vocab, h, static_rows=row_weights is not None)
        for h_chunk, counted_chunk in zip(h.tensor_split(chunks), counted.tensor_split(chunks), strict=True):
            logits = torch.mm(h_chunk, softmax_weight.t()).float()
            if softmax_bias is not None:
                logits += softmax_bias
            log_probs = torch.log_softmax(logits, dim=-1)
            # logsumexp of a row = any logit of it minus its log-probability (the target
            # may lie outside a restricted vocabulary, so the first column serves)
            log_normalisers.append(logits[:, 0] - log_probs[:, 0])
            if not needs_grad:
                continue
            assert grad_softmax_weight is not None  # allocated when needs_grad
            probs = log_probs.exp_()
            if grad_softmax_bias is not None:
                grad_softmax_bias += counted_chunk @ probs
            probs = probs.to(compute_dtype)
            grad_hiddens.append(torch.mm(probs, softmax_weight).float())
            if compute_dtype == torch.float32:
                grad_softmax_weight.addmm_(probs.t(), h_chunk)
            else:
                grad_softmax_weight += torch.mm(probs.t(), h_chunk).float()
        log_normaliser = torch.cat(log_normalisers)
        if row_weights is not None:  # a zero row's logits are all 0: its log-normaliser is log V
            log_normaliser = log_normaliser * row_weights
        nll = log_normaliser - target_logits
        nll_sum = nll.sum()
        eps = label_smoothing
        loss = nll_sum.clone()  # a tensor of its own: nll_sum is marked non-differentiable
        if eps != 0.0:
            # cross-entropy with the uniform distribution: logsumexp - mean logit, per row
            column_sum = softmax_weight.float().sum(0)
            mean_logits = h32 @ (column_sum / vocab)
            if softmax_bias is not None:
                mean_logits = mean_logits + softmax_bias.mean() * counted
            loss = (1.0 - eps) * nll_sum + eps * (log_normaliser - mean_logits).sum()
        if needs_grad:
            assert grad_softmax_weight is not None
            grad_hidden = torch.cat(grad_hiddens)
            if eps != 0.0:
                grad_hidden -= (eps / vocab) * column_sum
                grad_softmax_weight -= (eps / vocab) * h32.sum(0)
                if grad_softmax_bias is not None:
                    grad_softmax_bias -= (eps / vocab) * counted.sum()
            grad_hidden -= (1.0 - eps) * target_weights
            if row_weights is not None:
                grad_hidden *= row_weights[:, None]
            if vocab_ids is None:
                grad_weight = grad_softmax_weight
            else:
                grad_weight = torch.zeros(weight.shape, device=weight.device, dtype=torch.float32)
                grad_weight.index_copy_(0, vocab_ids, grad_softmax_weight)
            grad_weight.index_add_(0, targets, h32, alpha=-(1.0 - eps))
            grad_bias = None
            if grad_softmax_bias is not None:
                grad_bias = grad_softmax_bias
                if vocab_ids is not None:
                    grad_bias = torch.zeros(weight.shape[0], device=weight.device, dtype=torch.float32)
                    grad_bias.index_copy_(0, vocab_ids, grad_softmax_bias)
                grad_bias.index_add_(0, targets, counted, alpha=-(1.0 - eps))
            ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
        ctx.dtypes = (hidden.dtype, weight.dtype, None if bias is None else bias.dtype)
        ctx.mark_non_differentiable(nll_sum)
        return loss, nll_sum

    @staticmethod
    def backward(
        ctx: Any, grad_loss: Tensor, _grad_nll: Tensor
    ) -> tuple[Tensor, Tensor, None, None, None, None, None, Tensor | None]:
        grad_hidden, grad_weight, grad_bias = ctx.saved_tensors
        hidden_dtype, weight_dtype, bias_dtype = ctx.dtypes
        return (
            (grad_hidden * grad_loss).to(hidden_dtype),
            (grad_weight * grad_loss).to(weight_dtype),
            None,
            None,
            None,
            None,
            None,
            None if grad_bias is None else (grad_bias * grad_loss).to(bias_dtype),
        )


def output_loss(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    pad_id: int,
    label_smoothing: float,
    num_tokens: int | None = None,
    vocab_ids: Tensor | None = None,
    static_rows: bool = False,
    bias: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Summed label-smoothed loss and summed NLL of the logits `hidden @ weight.T` at the
    non-pad targets; the NLL is detached (it is reported, not trained on).

    hidden: (batch, tgt_len, d_model) final decoder states; weight: (vocab, d_model) the
    output projection without padded rows, so the smoothing mass is spread over the real
    vocabulary; targets: (batch, tgt_len) with pad_id at padding. `num_tokens`, the number
    of non-pad targets when the caller knows it (the batch does), selects the rows without
    a host-device synchronisation. Sums, not means: the trainer divides by the target tokens
    of the whole update (across accumulation and ranks). Under autocast the products run in
    autocast's dtype, softmax in fp32. `vocab_ids`: the rows of `weight` the softmax ranges
    over (`model.output_vocab=target`), all of them when None. With `static_rows` every
    position is projected and the pad ones weighted 0 (`num_tokens` unused): the shapes depend
    on the batch's shape only, as CUDA graphs need, at the cost of projecting the padding.
    `bias`: the output projection's bias (model.output_bias), rows as `weight`'s.
    """
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    flat_targets = targets.reshape(-1)
    not_pad = flat_targets != pad_id
    device = hidden.device.type
    compute_dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype
    if static_rows:
        row_weights = not_pad.float()
    else:
        if num_tokens is None:
            num_tokens = int(not_pad.sum())
        rows = torch.nonzero_static(not_pad, size=num_tokens).squeeze(1)
        flat_hidden, flat_targets, row_weights = (
            flat_hidden.index_select(0, rows),
            flat_targets.index_select(0, rows),
            None,
        )
    with torch.autocast(device, enabled=False):  # the function chooses its own dtypes
        losses: tuple[Tensor, Tensor] = _FusedOutputLoss.apply(
            flat_hidden, weight, flat_targets, vocab_ids, label_smoothing, compute_dtype, row_weights, bias
        )
    return losses


# Added to the attention before its log, so a zero weight on an aligned source piece costs
# -log(1e-9) ~ 21 instead of infinity (Marian's guided-alignment cross-entropy does the same).
ATTENTION_EPS = 1e-9


@dataclass(frozen=True)
class GuidedHead:
    """Which cross-attention head guided alignment trains, and the loss's weight."""

    layer: int
    head: int
    weight: float


def alignment_loss(attention: Tensor, alignment: Tensor) -> Tensor:
    """Summed cross-entropy -sum_t sum_s A[t, s] log(att[t, s]) of attention rows (batch,
    tgt_len, src_len) against row-normalised alignments of the same shape (all-zero rows, for
    target tokens without a link and padding, cost nothing)."""
    return -(alignment * torch.log(attention.float() + ATTENTION_EPS)).sum()


class TranslationLoss(nn.Module):
    """A Seq2SeqTransformer and its training loss, as one module (what DDP/compile wrap)."""

    def __init__(
        self,
        model: Seq2SeqTransformer,
        pad_id: int,
        label_smoothing: float,
        static_rows: bool = False,
        guided: GuidedHead | None = None,
    ) -> None:
        """`static_rows`: project every target position (see `output_loss`), for CUDA graphs.
        `guided`: the head guided alignment trains (batches then carry their alignments)."""
        super().__init__()
        self.model = model
        self.pad_id = pad_id
        self.label_smoothing = label_smoothing
        self.static_rows = static_rows
        self.guided = guided

    def forward(
        self,
        src_tokens: Tensor,
        src_padding_mask: Tensor | None,
        tgt_input: Tensor,
        tgt_output: Tensor,
        num_tgt_tokens: int | None = None,
        alignment: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """(summed loss, summed NLL) of a teacher-forced batch (`src_padding_mask` None: no
        source padding); with guided alignment, the loss includes the guided head's weighted `alignment_loss` against `alignment`."""
        if self.guided is not None and alignment is not None:
            hidden, attention = self.model.decoder_states_and_attention(
                src_tokens, src_padding_mask, tgt_input, self.guided.layer
            )
            loss, nll = self._output_loss(hidden, tgt_output, num_tgt_tokens)
            return loss + self.guided.weight * alignment_loss(attention[:, self.guided.head], alignment), nll
        hidden = self.model.decoder_states(src_tokens, src_padding_mask, tgt_input)
        return self._output_loss(hidden, tgt_output, num_tgt_tokens)

    def _output_loss(self, hidden: Tensor, tgt_output: Tensor, num_tgt_tokens: int | None) -> tuple[Tensor, Tensor]:
        return output_loss(
            hidden,
            self.model.output_weight,
            tgt_output,
            self.pad_id,
            self.label_smoothing,
            num_tgt_tokens,
            self.model.output_ids,
            self.static_rows,
            self.model.output_bias,
        )
