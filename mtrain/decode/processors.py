"""Step processors: rules that edit the next-token log-probabilities before a search step.

Each works in place on `lprobs` (rows, vocab), vectorised over rows, so its cost per step
does not grow with Python work per sentence. Banning a token sets its log-prob to -inf.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

NEG_INF = float("-inf")


def ban_tokens(lprobs: Tensor, token_ids: Tensor | Sequence[int]) -> None:
    """Never emit these tokens (pad and bos: they are not outputs).

    Pass the ids as a tensor on `lprobs`' device in a decoding loop: a Python list would be
    copied to the GPU at every step.
    """
    lprobs.index_fill_(1, torch.as_tensor(token_ids, device=lprobs.device), NEG_INF)


def apply_length_limits(lprobs: Tensor, step: int, min_len: int, max_len: Tensor | None, eos_id: int) -> None:
    """Ban EOS before `min_len` output tokens; force EOS once a row has `max_len` tokens
    (the limit wins over `min_len` when they clash).

    At `step` a row holds `step` output tokens (bos excluded), so EOS chosen now gives an
    output of `step` tokens. max_len (rows,) long: each row's own limit (it depends on the
    sentence's source length); None when the caller knows no row is at its limit yet. The
    rows at their limit are masked, not looked up: no host synchronisation.
    """
    if max_len is None:
        if step < min_len:
            lprobs[:, eos_id] = NEG_INF
        return
    at_limit = max_len <= step  # (rows,)
    eos_lprobs = lprobs[:, eos_id].clone()  # a forced EOS keeps the model's log-prob
    if step < min_len:
        eos_lprobs.masked_fill_(~at_limit, NEG_INF)
    lprobs.masked_fill_(at_limit.unsqueeze(-1), NEG_INF)
    lprobs[:, eos_id] = eos_lprobs


class NoRepeatNgram:
    """Ban any token that would repeat an n-gram already present in the row's output.

    For output y_1..y_t, every earlier occurrence of the last n-1 tokens bans the token
    that followed it. Matches are found for all rows at once with `unfold`.
    """

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError("no_repeat_ngram must be >= 1")
        self.n = n

    def __call__(self, lprobs: Tensor, outputs: Tensor) -> None:
        """outputs (rows, t): the tokens emitted so far (bos excluded)."""
        n = self.n
        t = outputs.size(1)
        if n == 1:
            lprobs.scatter_(1, outputs, NEG_INF)
            return
        if t < n:
            return  # no earlier n-gram whose prefix could match yet
        windows = outputs.unfold(1, n, 1)  # (rows, t-n+1, n): every n-gram so far
        last = outputs[:, t - (n - 1) :].unsqueeze(1)  # (rows, 1, n-1): the current prefix
        matches = (windows[:, :, :-1] == last).all(dim=-1)  # (rows, t-n+1)
        banned = torch.zeros_like(lprobs).scatter_add_(1, windows[:, :, -1], matches.to(lprobs.dtype))
        lprobs.masked_fill_(banned > 0, NEG_INF)
