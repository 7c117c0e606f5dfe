"""Target prefixes and lexical constraints inside the search, as tensors over all hypotheses.

One sentence's controls (`ControlIds`, target token ids) are:

- a **prefix**: the output's first tokens, forced one per step (every other token gets
  -inf, the forced one keeps the model's log-probability: scores include the prefix, as
  fairseq's `--prefix-size`); the search continues from it;
- **constraints**: phrases that must appear (fairseq's `--constraints`). EOS is banned for a
  hypothesis until it holds all of them, and the beam is shared out among *banks* (Hu et
  al. 2019, Post & Vilar 2018): a hypothesis' bank is the number of constraint tokens it
  has produced so far (whole phrases and the longest started one); candidates are ranked
  within their bank by score and taken in turns, the fullest bank first, so hypotheses
  that placed more of the constraints survive beside the unconstrained best. Each live
  hypothesis proposes, besides the beam's usual top candidates and its own best token, the
  next token of every constraint it has not met yet. `ordered`: the phrases must appear in
  the given order (a phrase only counts once those before it are met);
- **avoid**: phrases that must not appear: the token that would complete one gets -inf.

A constraint ends a word: right after its last token, a piece that would continue the word
(`s` after `▁dog`: the engine's `word_continuations`) is banned, so a hypothesis meets `dog`
with the word `dog`, not with `dogs` (unless the piece advances another constraint: with
`bull` and `bullpen` both asked for, `▁bull` may go on to `pen`).

Matching a phrase is exact token matching, tracked for every hypothesis and phrase at once
with the shift-and algorithm: a boolean `partial[row, phrase, k]` says the last k output
tokens equal the phrase's first k; a new token y shifts it: `partial'[k+1] = partial[k] &
(phrase[k] == y)`. So every occurrence is seen, overlapping ones too, with a constant number
of tensor operations per step: no Python work per hypothesis or sentence.

Limits: a sentence with constraints may write as many more tokens as its constraints hold
(its `max_len` grows by that much), one with a prefix at least the prefix; a hypothesis that
reaches its length limit ends there (EOS is forced) even without its constraints: it ranks
after every hypothesis that holds them, and is the output only when none does (better than
no output). The same phrase given twice must appear once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from mtrain.config import DecodeConfig, Sampling
from mtrain.decode.search.algorithms import BeamSearch, Choices
from mtrain.decode.search.processors import StepProcessor, StepView

NEG_INF = float("-inf")
NO_TOKEN = -1  # padding of the phrase tensors: equal to no token, so it never matches


@dataclass(frozen=True)
class ControlIds:
    """One sentence's target prefix, constraints and banned phrases, as target token ids."""

    prefix: tuple[int, ...] = ()
    constraints: tuple[tuple[int, ...], ...] = ()
    avoid: tuple[tuple[int, ...], ...] = ()
    ordered: bool = False  # the constraints must appear in this order
    # Per constraint (in order), the source pieces of the glossary term it came from (empty: a
    # constraint given as such), and the source's sentence-final marks: term placement's
    # (mtrain.decode.search.placement)
    term_sources: tuple[tuple[int, ...], ...] = ()
    sentence_ends: int = 0
    # The prefix's first `unscored` tokens are forced with log-probability 0, not the model's:
    # tokens the model does not choose (M2M100's target-language token, as transformers'
    # forced_bos_token_id scores it), so they weigh on no hypothesis' length-normalised score.
    unscored: int = 0

    def __post_init__(self) -> None:
        if any(not phrase for phrase in (*self.constraints, *self.avoid)):
            raise ValueError("an empty constraint or avoided phrase")

    @property
    def empty(self) -> bool:
        return not (self.prefix or self.constraints or self.avoid)


def _padded(rows: Sequence[Sequence[int]], device: torch.device) -> tuple[Tensor, Tensor]:
    """Token rows padded with NO_TOKEN to (len(rows), longest) and their lengths."""
    longest = max((len(row) for row in rows), default=0)
    tokens = torch.full((len(rows), max(longest, 1)), NO_TOKEN, dtype=torch.long)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = torch.as_tensor(row, dtype=torch.long)
    lengths = torch.tensor([len(row) for row in rows], dtype=torch.long)
    return tokens.to(device), lengths.to(device)


@dataclass
class Phrases:
    """Per sentence, a padded set of phrases: tokens (batch, phrases, longest), lengths
    (batch, phrases), 0 for padding."""

    tokens: Tensor
    lengths: Tensor

    @classmethod
    def of(cls, per_sentence: Sequence[Sequence[Sequence[int]]], device: torch.device) -> Phrases:
        count = max((len(phrases) for phrases in per_sentence), default=0)
        longest = max((len(p) for phrases in per_sentence for p in phrases), default=1)
        tokens = torch.full((len(per_sentence), count, longest), NO_TOKEN, dtype=torch.long)
        lengths = torch.zeros(len(per_sentence), count, dtype=torch.long)
        for s, phrases in enumerate(per_sentence):
            for p, phrase in enumerate(phrases):
                tokens[s, p, : len(phrase)] = torch.as_tensor(phrase, dtype=torch.long)
                lengths[s, p] = len(phrase)
        return cls(tokens.to(device), lengths.to(device))

    @property
    def count(self) -> int:
        return self.tokens.size(1)

    def start(self, rows: int) -> Tensor:
        """The matching state before any output: (rows, phrases, longest + 1), only k=0 true."""
        partial = torch.zeros(rows, self.count, self.tokens.size(2) + 1, dtype=torch.bool, device=self.tokens.device)
        partial[:, :, 0] = True
        return partial


def shift(partial: Tensor, phrase_tokens: Tensor, tokens: Tensor, allowed: Tensor | None = None) -> Tensor:
    """The matching state after appending `tokens` (r,) to rows in state `partial` (r, p, L+1),
    phrase_tokens (r, p, L) each row's phrases; `allowed` (r, p): phrases that may advance."""
    advanced = partial[:, :, :-1] & (phrase_tokens == tokens.view(-1, 1, 1))
    if allowed is not None:
        advanced &= allowed.unsqueeze(-1)
    return torch.cat([partial[:, :, :1], advanced], dim=2)


def completed(partial: Tensor, lengths: Tensor) -> Tensor:
    """(r, p) the phrase (length > 0) ends at the last token."""
    return partial.gather(2, lengths.unsqueeze(-1)).squeeze(-1) & (lengths > 0)


@dataclass
class ConstraintState:
    """Per hypothesis row: how far each constraint is matched, and which are met."""

    partial: Tensor  # (rows, constraints, longest + 1) bool
    met: Tensor  # (rows, constraints) bool; padding phrases count as met


@dataclass
class TargetControls(StepProcessor):
    """A batch's controls in the decoding loop, a step processor (mtrain.decode.search.processors):
    it follows the rows as the generator reorders them.

    Built by `controls_for`; the generator calls its hooks with the other processors'
    (`limit_lengths`, `start`, per step `observe`, `process` and `follow`; `satisfied` as
    hypotheses finish); with constraints, `ConstrainedBeamSearch` makes the choices (`choose`).
    """

    prefix: Tensor  # (batch, longest prefix) NO_TOKEN-padded
    prefix_lengths: Tensor  # (batch,)
    unscored_lengths: Tensor  # (batch,) how many prefix tokens are forced with log-probability 0
    constraints: Phrases | None
    avoid: Phrases | None
    ordered: Tensor  # (batch,) bool
    any_ordered: bool  # (known on the host: no synchronisation per step)
    eos_id: int
    # Pieces that continue a word, banned right after a constraint completes (None: not banned).
    word_continuations: Tensor | None = None
    row_sentence: Tensor = field(init=False)  # (rows,) the batch sentence of each hypothesis row
    step: int = field(init=False, default=0)
    state: ConstraintState | None = field(init=False, default=None)
    avoid_partial: Tensor | None = field(init=False, default=None)
    just_completed: Tensor | None = field(init=False, default=None)  # (rows,) a constraint ended at the last token
    continuing: Tensor | None = field(init=False, default=None)  # (vocab,) bool: word_continuations as a mask
    forced_lprobs: Tensor | None = field(init=False, default=None)  # (rows, 1) the model's own, of the prefix token

    def start(self, width: int) -> None:
        """`width` rows per sentence, sentence-major, all empty."""
        batch = self.prefix.size(0)
        self.row_sentence = torch.arange(batch, device=self.prefix.device).repeat_interleave(width)
        rows = self.row_sentence.size(0)
        if self.constraints is not None:
            self.state = ConstraintState(
                self.constraints.start(rows), self.constraints.lengths.index_select(0, self.row_sentence) == 0
            )
        if self.avoid is not None:
            self.avoid_partial = self.avoid.start(rows)

    def limit_lengths(self, max_len: Tensor) -> Tensor:
        """Each sentence's output limit (batch,) made room for its prefix and constraints."""
        if self.constraints is not None:
            max_len = max_len + self.constraints.lengths.sum(dim=1)
        return torch.maximum(max_len, self.prefix_lengths)

    @property
    def has_constraints(self) -> bool:
        return self.constraints is not None

    def own_search(self, cfg: DecodeConfig) -> ConstrainedBeamSearch | None:
        """With constraints, the constrained beam chooses."""
        return constrained_search(cfg, self) if self.has_constraints else None

    def observe(self, lprobs: Tensor, view: StepView) -> None:
        """While a prefix is forced: its token's log-probability before any processor (the
        forced token keeps its own, even where a rule would ban it)."""
        self.forced_lprobs = None
        if self.step < self.prefix.size(1):
            forced = self.prefix[:, self.step].index_select(0, self.row_sentence).clamp(min=0).unsqueeze(1)
            self.forced_lprobs = lprobs.gather(1, forced)

    def process(self, lprobs: Tensor, view: StepView) -> None:
        """Edit this step's lprobs (rows, vocab) in place: avoided phrases banned, EOS banned
        while constraints are unmet (not at the length limit), the prefix forced."""
        step, row_max_len, eos_id = self.step, view.row_max_len, self.eos_id
        if self.avoid is not None and self.avoid_partial is not None:
            tokens = self.avoid.tokens.index_select(0, self.row_sentence)  # (rows, a, L)
            lengths = self.avoid.lengths.index_select(0, self.row_sentence)  # (rows, a)
            last = (lengths - 1).clamp(min=0)
            # A phrase whose all but last tokens were just written bans its last token.
            armed = self.avoid_partial.gather(2, last.unsqueeze(-1)).squeeze(-1) & (lengths > 0)
            last_token = tokens.gather(2, last.unsqueeze(-1)).squeeze(-1).clamp(min=0)
            ban = torch.where(armed, NEG_INF, float("inf")).to(lprobs.dtype)
            lprobs.scatter_reduce_(1, last_token, ban, reduce="amin")
        if self.state is not None:
            unmet = ~self.state.met.all(dim=1) & (row_max_len > step)
            lprobs[:, eos_id] = lprobs[:, eos_id].masked_fill(unmet, NEG_INF)
        if self.just_completed is not None and self.word_continuations is not None:
            # A constraint ends a word: `▁dog` is not continued into `dogs`.
            if self.continuing is None or self.continuing.size(0) != lprobs.size(1):
                self.continuing = torch.zeros(lprobs.size(1), dtype=torch.bool, device=lprobs.device)
                self.continuing[self.word_continuations[self.word_continuations < lprobs.size(1)]] = True
            banned = self.just_completed.unsqueeze(1) & self.continuing  # (rows, vocab)
            # ... unless the piece advances another constraint (`bull` met, `bullpen` under way).
            advancing = self._next_tokens()  # (rows, constraints), -1: none
            exempt = torch.zeros_like(banned, dtype=torch.long).scatter_reduce_(
                1, advancing.clamp(min=0), (advancing >= 0).long(), reduce="amax"
            )
            lprobs.masked_fill_(banned & (exempt == 0), NEG_INF)
        if step < self.prefix.size(1):
            assert self.forced_lprobs is not None  # (observed at this step)
            lengths = self.prefix_lengths.index_select(0, self.row_sentence)
            forcing = (lengths > step) & (row_max_len > step)  # (rows,)
            forced = self.prefix[:, step].index_select(0, self.row_sentence).clamp(min=0).unsqueeze(1)
            unscored = self.unscored_lengths.index_select(0, self.row_sentence) > step  # (rows,)
            kept = self.forced_lprobs.masked_fill(unscored.unsqueeze(1), 0.0)
            lprobs.masked_fill_(forcing.unsqueeze(1), NEG_INF)
            lprobs.scatter_(1, forced, torch.where(forcing.unsqueeze(1), kept, lprobs.gather(1, forced)))

    def choose(self, lprobs: Tensor, scores: Tensor) -> Choices:
        """The constrained beam's choices: lprobs (n, width, vocab), scores (n, width); n
        sentences, those of `row_sentence` in order."""
        assert self.constraints is not None and self.state is not None
        n, width, vocab = lprobs.shape
        device = lprobs.device
        total = scores.unsqueeze(-1) + lprobs  # (n, width, vocab)
        top_scores, top_index = total.view(n, -1).topk(min(2 * width, width * vocab), dim=1)
        best_scores, best_tokens = total.max(dim=-1)  # each row's own best: (n, width)
        row_of = torch.arange(width, device=device).expand(n, width)
        next_tokens = self._next_tokens().view(n, width, -1)  # (n, width, constraints)
        forced_scores = total.gather(2, next_tokens.clamp(min=0)).masked_fill(next_tokens < 0, NEG_INF)
        count = next_tokens.size(2)
        beam_index = torch.cat(
            [top_index // vocab, row_of, row_of.unsqueeze(-1).expand(n, width, count).reshape(n, -1)], dim=1
        )
        tokens = torch.cat([top_index % vocab, best_tokens, next_tokens.clamp(min=0).view(n, -1)], dim=1)
        cand_scores = torch.cat([top_scores, best_scores, forced_scores.view(n, -1)], dim=1)  # (n, k)
        cand_scores = _drop_duplicates(beam_index * vocab + tokens, cand_scores)
        banks = self._banks_after(beam_index, tokens, width)
        order = _bank_order(banks, cand_scores)
        return Choices(beam_index.gather(1, order), tokens.gather(1, order), cand_scores.gather(1, order))

    def satisfied(self, rows: Tensor) -> Tensor | None:
        """(len(rows),) whether these rows hold all their constraints; None without constraints."""
        if self.state is None:
            return None
        return self.state.met.index_select(0, rows).all(dim=1)

    def follow(self, rows: Tensor, tokens: Tensor) -> None:
        """The live rows are now `rows` (indices into the current rows) extended by `tokens`."""
        self.row_sentence = self.row_sentence.index_select(0, rows)
        if self.state is not None:
            self.state = self._advanced(
                ConstraintState(self.state.partial.index_select(0, rows), self.state.met.index_select(0, rows)),
                self.row_sentence,
                tokens,
            )
            if self.word_continuations is not None:
                assert self.constraints is not None
                lengths = self.constraints.lengths.index_select(0, self.row_sentence)
                self.just_completed = completed(self.state.partial, lengths).any(dim=1)
        if self.avoid is not None and self.avoid_partial is not None:
            phrases = self.avoid.tokens.index_select(0, self.row_sentence)
            self.avoid_partial = shift(self.avoid_partial.index_select(0, rows), phrases, tokens)
        self.step += 1

    def _advanced(self, state: ConstraintState, sentences: Tensor, tokens: Tensor) -> ConstraintState:
        assert self.constraints is not None
        phrases = self.constraints.tokens.index_select(0, sentences)
        lengths = self.constraints.lengths.index_select(0, sentences)
        allowed = None
        if self.any_ordered:
            ordered = self.ordered.index_select(0, sentences)
            # A phrase may advance once every phrase before it is met (ordered sentences only).
            before_met = torch.cumprod(torch.cat([torch.ones_like(state.met[:, :1]), state.met[:, :-1]], 1), 1)
            allowed = before_met.bool() | ~ordered.unsqueeze(1)
        partial = shift(state.partial, phrases, tokens, allowed)
        return ConstraintState(partial, state.met | completed(partial, lengths))

    def _progress(self, state: ConstraintState, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """Per row and constraint: tokens produced (met: its length; else the longest match in
        progress), and that longest match."""
        longest = state.partial.size(2)
        positions = torch.arange(longest, device=lengths.device)
        in_progress = (state.partial.long() * positions).amax(dim=2)  # (rows, constraints)
        return torch.where(state.met, lengths, in_progress), in_progress

    def _next_tokens(self) -> Tensor:
        """(rows, constraints): the token that advances each unmet constraint (-1: none)."""
        assert self.constraints is not None and self.state is not None
        lengths = self.constraints.lengths.index_select(0, self.row_sentence)
        phrases = self.constraints.tokens.index_select(0, self.row_sentence)
        _, in_progress = self._progress(self.state, lengths)
        nxt = phrases.gather(2, in_progress.clamp(max=phrases.size(2) - 1).unsqueeze(-1)).squeeze(-1)
        wanted = ~self.state.met
        ordered = self.ordered.index_select(0, self.row_sentence).unsqueeze(1)
        first_unmet = torch.cumsum(wanted.long(), dim=1) == 1
        wanted &= first_unmet | ~ordered  # in order: only the first unmet phrase
        return nxt.masked_fill(~wanted, NO_TOKEN)

    def _banks_after(self, beam_index: Tensor, tokens: Tensor, width: int) -> Tensor:
        """(n, k) the bank (constraint tokens produced) of each candidate after its token."""
        assert self.constraints is not None and self.state is not None
        n, k = tokens.shape
        rows = (torch.arange(n, device=tokens.device).unsqueeze(1) * width + beam_index).view(-1)
        sentences = self.row_sentence.index_select(0, rows)
        state = ConstraintState(self.state.partial.index_select(0, rows), self.state.met.index_select(0, rows))
        after = self._advanced(state, sentences, tokens.view(-1))
        produced, _ = self._progress(after, self.constraints.lengths.index_select(0, sentences))
        return produced.sum(dim=1).view(n, k)


def _drop_duplicates(keys: Tensor, scores: Tensor) -> Tensor:
    """`scores` with all but one of the candidates sharing a key (row and token) set to -inf."""
    sorted_keys, order = keys.sort(dim=1, stable=True)
    repeat = torch.zeros_like(sorted_keys, dtype=torch.bool)
    repeat[:, 1:] = sorted_keys[:, 1:] == sorted_keys[:, :-1]
    duplicate = torch.zeros_like(repeat).scatter(1, order, repeat)
    return scores.masked_fill(duplicate, NEG_INF)


def _bank_order(banks: Tensor, scores: Tensor) -> Tensor:
    """(n, k) candidate order: by score within each bank, the banks taking turns, the fullest
    first (fairseq's stripes); dead candidates (-inf) last."""
    k = scores.size(1)
    by_score = scores.argsort(dim=1, descending=True, stable=True)
    bank_sorted = banks.gather(1, by_score)
    by_bank = bank_sorted.argsort(dim=1, descending=True, stable=True)
    order = by_score.gather(1, by_bank)  # by bank, then score
    grouped = banks.gather(1, order)
    positions = torch.arange(k, device=banks.device).expand_as(grouped)
    starts = torch.ones_like(grouped, dtype=torch.bool)
    starts[:, 1:] = grouped[:, 1:] != grouped[:, :-1]
    rank = positions - torch.where(starts, positions, 0).cummax(dim=1).values  # rank within its bank
    top = grouped.max(dim=1, keepdim=True).values
    key = rank * (top + 2) + (top - grouped)
    dead = torch.isinf(scores.gather(1, order))
    key = key.masked_fill(dead, torch.iinfo(torch.long).max)
    return order.gather(1, key.argsort(dim=1, stable=True))


class ConstrainedBeamSearch(BeamSearch):
    """Beam search whose choices are the constrained beam's (`TargetControls.choose`: banks)."""

    def __init__(self, width: int, target: TargetControls) -> None:
        super().__init__(width)
        self.target = target

    def step(self, lprobs: Tensor, scores: Tensor) -> Choices:
        return self.target.choose(lprobs, scores)


def constrained_search(cfg: DecodeConfig, target: TargetControls) -> ConstrainedBeamSearch:
    """The constrained beam of `cfg.beam` rows; constraints need beam search."""
    if cfg.sampling != Sampling.none:
        raise ValueError("lexical constraints need beam search (decode.sampling=none)")
    return ConstrainedBeamSearch(cfg.beam, target)


def controls_for(
    controls: Sequence[ControlIds | None], device: torch.device, eos_id: int, word_continuations: Sequence[int] = ()
) -> TargetControls | None:
    """The batch's controls as tensors; None when no sentence has any (decoding as before).
    `word_continuations`: pieces that never follow a completed constraint (none: no such rule)."""
    given = [c or ControlIds() for c in controls]
    if all(c.empty for c in given):
        return None
    prefix, prefix_lengths = _padded([c.prefix for c in given], device)
    unscored = torch.tensor([min(c.unscored, len(c.prefix)) for c in given], dtype=torch.long, device=device)
    constraints = [list(dict.fromkeys(c.constraints)) for c in given]  # a phrase given twice: once
    avoid = [c.avoid for c in given]
    return TargetControls(
        prefix=prefix if int(prefix_lengths.max()) > 0 else prefix[:, :0],
        prefix_lengths=prefix_lengths,
        unscored_lengths=unscored,
        constraints=Phrases.of(constraints, device) if any(constraints) else None,
        avoid=Phrases.of(avoid, device) if any(avoid) else None,
        ordered=torch.tensor([c.ordered for c in given], dtype=torch.bool, device=device),
        any_ordered=any(c.ordered and c.constraints for c in given),
        eos_id=eos_id,
        word_continuations=torch.tensor(word_continuations, dtype=torch.long, device=device)
        if word_continuations and any(constraints)
        else None,
    )
