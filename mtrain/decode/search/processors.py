"""Step processors: rules that edit the next-token log-probabilities before a search step.

Each works in place on `lprobs` (rows, vocab), vectorised over rows, so its cost per step
does not grow with Python work per sentence. Banning a token sets its log-prob to -inf.

The generator holds one list of them (its own, which every decode has: tokens never emitted,
length limits, no-repeat-ngram; then those it is given: a batch's controls, built once per
batch by `mtrain.decode.search.steering.batch_processors`: the vocabulary's banned tags, the
target prefix, constraints and avoided phrases of `mtrain.decode.search.constraints.TargetControls`,
term placement) and calls each through the hooks of `StepProcessor`, in order: `limit_lengths` and `start` once, then per step `observe` (the
model's own log-probabilities, before any processor edits them), `process` and, once the
search has chosen, `follow` (the rows kept, the tokens appended); `satisfied` ranks finished
hypotheses. No hook reads a tensor on the host: the loop's host synchronisations stay its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from mtrain.config import DecodeConfig
    from mtrain.decode.search.algorithms import SearchAlgorithm

NEG_INF = float("-inf")


@dataclass
class StepView:
    """What a processor may read at one step of the loop."""

    step: int  # output tokens each live row holds (bos excluded)
    outputs: Tensor  # (rows, step) those tokens
    row_max_len: Tensor  # (rows,) each row's output limit
    limits_reached: bool  # a row may be at its limit now (known on the host: no synchronisation)
    # (rows, src_len) this step's cross-attention at the alignment layer, when a processor reads it
    # (term placement, mtrain.decode.search.placement); None otherwise
    attention: Tensor | None = None


class StepProcessor:
    """A rule of the decoding loop; every hook but `process` does nothing unless overridden."""

    # The cross-attention the rule reads in `StepView.attention` ("LAYER", "LAYER:HEAD" or an
    # index, as `generate`'s attention_layer): the loop asks the step function for it. None: none.
    attention_layer: int | str | None = None

    def own_search(self, cfg: DecodeConfig) -> SearchAlgorithm | None:
        """The search algorithm the rule must choose with (the constrained beam of lexical
        constraints); None: whichever `cfg` asks for."""
        return None

    def limit_lengths(self, max_len: Tensor) -> Tensor:
        """Each sentence's output limit (batch,), made room for what the rule adds."""
        return max_len

    def start(self, width: int) -> None:
        """`width` rows per sentence, sentence-major, all empty."""

    def observe(self, lprobs: Tensor, view: StepView) -> None:
        """This step's log-probabilities before any processor edited them (read only)."""

    def process(self, lprobs: Tensor, view: StepView) -> None:
        """Edit this step's lprobs (rows, vocab) in place."""
        raise NotImplementedError

    def follow(self, rows: Tensor, tokens: Tensor) -> None:
        """The live rows are now `rows` (indices into the current rows) extended by `tokens`."""

    def satisfied(self, rows: Tensor) -> Tensor | None:
        """(len(rows),) whether these rows (finishing now) hold what the rule requires; None:
        the rule requires nothing (finished hypotheses rank by score alone)."""
        return None


class NeverEmitted(StepProcessor):
    """pad, bos and a multilingual run's tags are never outputs."""

    def __init__(self, token_ids: Tensor) -> None:
        self.token_ids = token_ids  # on the decoding device: a list would be copied there every step

    def process(self, lprobs: Tensor, view: StepView) -> None:
        ban_tokens(lprobs, self.token_ids)


class LengthLimits(StepProcessor):
    """EOS banned before `min_len` output tokens, forced at each row's limit."""

    def __init__(self, min_len: int, eos_id: int) -> None:
        self.min_len, self.eos_id = min_len, eos_id

    def process(self, lprobs: Tensor, view: StepView) -> None:
        apply_length_limits(
            lprobs, view.step, self.min_len, view.row_max_len if view.limits_reached else None, self.eos_id
        )


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


class NoRepeatNgram(StepProcessor):
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

    def process(self, lprobs: Tensor, view: StepView) -> None:
        self(lprobs, view.outputs)
