"""Sampling as a search algorithm: each live row draws its next token (back-translation).

The distribution is the model's, reshaped by `temperature` and cut to the `top_k` most
probable tokens, to the smallest set whose probability reaches `top_p` (nucleus), or to the
tokens of probability at least `epsilon` (epsilon sampling, Hewitt et al. 2022: unlike top-p
it cuts the unreliable tail whatever the shape of the head; Freitag et al. 2023 found it the
best source of candidates for MBR decoding, at epsilon 0.02). The
score accumulated is the model's log-probability of the drawn token (after step
processors, before temperature and truncation), so n-best samples rank by model score.
Draws come from a seeded `torch.Generator`: the same inputs and seed give the same samples.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mtrain.decode.search.algorithms import Choices


def truncate_distribution(logits: Tensor, top_k: int = 0, top_p: float = 1.0, epsilon: float = 0.0) -> Tensor:
    """Set to -inf every token outside the top-k, outside the top-p nucleus and below
    probability `epsilon`.

    logits (rows, vocab). `top_k=0`, `top_p>=1` and `epsilon=0` disable each cut. The most
    probable token always survives.
    """
    if top_k > 0 and top_k < logits.size(-1):
        kth_best = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_best, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        # A token is dropped when the tokens before it already reach top_p.
        drop_sorted = (cumulative - sorted_logits.softmax(dim=-1)) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    if epsilon > 0.0:
        probs = logits.softmax(dim=-1)
        drop = (probs < epsilon) & (probs < probs.max(dim=-1, keepdim=True).values)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


class SamplingSearch:
    """Draw one token per live row; `width` independent samples per sentence."""

    def __init__(
        self,
        width: int,
        top_k: int = 0,
        top_p: float = 1.0,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
        epsilon: float = 0.0,
    ) -> None:
        if temperature <= 0:
            raise ValueError("temperature must be > 0")
        self.width = width
        self.top_k = top_k
        self.top_p = top_p
        self.epsilon = epsilon
        self.temperature = temperature
        self.generator = generator

    def initial_scores(self, n: int, device: torch.device) -> Tensor:
        return torch.zeros(n, self.width, device=device)  # independent samples

    def step(self, lprobs: Tensor, scores: Tensor) -> Choices:
        n, width, vocab = lprobs.shape
        flat = lprobs.reshape(n * width, vocab)
        logits = truncate_distribution(flat / self.temperature, self.top_k, self.top_p, self.epsilon)
        # A row whose every token is banned stays dead; give the draw something to pick.
        no_choice = torch.isinf(logits).all(dim=-1, keepdim=True)
        logits = logits.masked_fill(no_choice, 0.0)
        tokens = torch.multinomial(logits.softmax(dim=-1), 1, generator=self.generator)  # (rows, 1)
        token_lprobs = flat.gather(-1, tokens).view(n, width)
        beam_index = torch.arange(width, device=lprobs.device).expand(n, width)
        return Choices(beam_index, tokens.view(n, width), scores + token_lprobs)
