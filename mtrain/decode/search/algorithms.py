"""Search algorithms: one decoding step, scores in, choices out.

An algorithm sees, for every live hypothesis of every sentence, the log-probabilities of
the next token and the hypothesis' cumulative score, and returns its choices: which live
hypothesis to extend (`beam_index`), with which token, and the extended score. It keeps no
state and knows nothing about EOS, finished hypotheses, models or caches: the generator
loop (`generator.py`) owns those, and step processors (`processors.py`) edit the
log-probabilities before an algorithm sees them. Sampling lives in `sampling.py`.

Shapes: `n` sentences, `width` live hypotheses each (rows of a sentence whose score is
-inf are dead: they never produce a finite choice), `vocab` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor


@dataclass
class Choices:
    """Candidate extensions per sentence, in the algorithm's order of preference."""

    beam_index: Tensor  # (n, k) long: which live row of the sentence is extended
    tokens: Tensor  # (n, k) long: the token appended
    scores: Tensor  # (n, k) float: cumulative log-probability after appending


class SearchAlgorithm(Protocol):
    """One step of a search. `width` live rows per sentence; the generator takes the first
    `width` choices that do not end in EOS as the next live set, and accepts an EOS choice
    as a finished hypothesis only if it is among the first `width` choices."""

    width: int

    def initial_scores(self, n: int, device: torch.device) -> Tensor:
        """(n, width) scores before the first step; -inf marks rows that start dead."""
        ...

    def step(self, lprobs: Tensor, scores: Tensor) -> Choices:
        """lprobs (n, width, vocab) this step's log-probs; scores (n, width) so far."""
        ...


class GreedySearch:
    """Each live row takes its most probable next token (width 1 is greedy decoding)."""

    def __init__(self, width: int = 1) -> None:
        self.width = width

    def initial_scores(self, n: int, device: torch.device) -> Tensor:
        return torch.zeros(n, self.width, device=device)  # rows are independent

    def step(self, lprobs: Tensor, scores: Tensor) -> Choices:
        token_lprobs, tokens = lprobs.max(dim=-1)  # (n, width)
        beam_index = torch.arange(self.width, device=lprobs.device).expand_as(tokens)
        return Choices(beam_index, tokens, scores + token_lprobs)


class BeamSearch:
    """Keep the `width` best-scoring extensions over all live rows of a sentence.

    It proposes `2 * width` candidates, best first, so that after the generator sets the
    ones ending in EOS aside as finished, `width` live continuations remain (at most
    `width` of the candidates can be EOS, one per row).
    """

    def __init__(self, width: int) -> None:
        self.width = width

    def initial_scores(self, n: int, device: torch.device) -> Tensor:
        # All rows start as the same empty prefix: only one may be extended, or the beam
        # would fill with copies of the same hypothesis.
        scores = torch.full((n, self.width), float("-inf"), device=device)
        scores[:, 0] = 0.0
        return scores

    def step(self, lprobs: Tensor, scores: Tensor) -> Choices:
        n, width, vocab = lprobs.shape
        total = (scores.unsqueeze(-1) + lprobs).view(n, width * vocab)  # (n, width*vocab)
        k = min(2 * width, width * vocab)
        top_scores, flat_index = total.topk(k, dim=-1)  # sorted, best first
        return Choices(flat_index // vocab, flat_index % vocab, top_scores)
