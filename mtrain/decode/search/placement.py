"""Where a glossary term goes: at the step that translates its source word, in place of the
model's own word (`decode.term_placement=aligned`), a step processor beside the constraints.

Hard constraints (mtrain.decode.search.constraints) only make a term appear: the search puts it
wherever it costs least, which is often *beside* the model's usual translation of the same
word ("the man ... while gentleman is scratching") or after the final full stop ("... of a
building. lass."). This processor ties each term to its source word with the cross-attention
the decoder computes anyway (the layer word alignments read, mtrain.decode.translation.alignment), for
every live hypothesis at once:

- **start where the source word is translated**: at a step whose attention peaks on one of
  the term's source pieces, a hypothesis that has not started the term may start it at the
  score of the model's best token there (the term takes the place of the model's own word);
- **the usual word does not stay beside it**: the model's best word at the step a term
  started (its usual translation, `dog` for `canine`) is banned from that hypothesis from then
  on; and a hypothesis that was offered the term there and wrote the model's own word instead
  is not offered it again (it would get `girl lass` as cheaply as another gets `lass`);
- **no term after the end**: while a hypothesis still misses a constraint, it may not write
  more sentence-final marks (`.`, `!`, `?`) than the source holds, less one, so a term is never
  appended behind the full stop.

What a sentence brings (`ControlIds.term_sources`): per constraint, the source pieces of the
term it came from (empty for a constraint given as such), and how many sentence-final marks
its source holds. The vocabulary sets (`PlacementVocab`) come from the target tokenizer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from mtrain.config import DEFAULT_ALIGNMENT_LAYER, DecodeConfig
from mtrain.decode.search.constraints import ControlIds, TargetControls
from mtrain.decode.search.processors import StepProcessor, StepView

NEG_INF = float("-inf")
SENTENCE_END_MARKS = frozenset(".!?")
WORD_START = "\u2581"


@dataclass(frozen=True)
class PlacementVocab:
    """Target pieces the rules need: sentence-final marks, and pieces that begin a content word
    (`▁` and a letter or digit)."""

    sentence_ends: tuple[int, ...]
    content_starts: tuple[int, ...]

    @classmethod
    def of(cls, pieces: Sequence[str]) -> PlacementVocab:
        """From the target vocabulary's pieces, in id order."""
        ends = [
            i
            for i, piece in enumerate(pieces)
            if piece.strip(WORD_START) and set(piece.strip(WORD_START)) <= SENTENCE_END_MARKS
        ]
        starts = [i for i, piece in enumerate(pieces) if piece.startswith(WORD_START) and piece[1:2].isalnum()]
        return cls(tuple(ends), tuple(starts))


def sentence_end_count(text: str) -> int:
    """Sentence-final marks of a source text: runs of `.`, `!` or `?` ending a word."""
    count, previous = 0, " "
    for position, character in enumerate(text + " "):
        if previous in SENTENCE_END_MARKS and (character.isspace() or position == len(text)):
            count += 1
        previous = character
    return count


def _mask(ids: Sequence[int], size: int, device: torch.device) -> Tensor:
    mask = torch.zeros(size, dtype=torch.bool, device=device)
    given = torch.tensor([i for i in ids if i < size], dtype=torch.long, device=device)
    if given.numel():
        mask[given] = True
    return mask


@dataclass
class TermPlacement(StepProcessor):
    """The rules above for a batch, following its rows; reads the constraint state of `target`
    (a `TargetControls` in the same processor list, before this one).

    `sources` (batch, constraints, src_len) bool: each constraint's term source pieces (the
    constraints in `target.constraints`' order); `sentence_ends` (batch,): the source's
    sentence-final marks. `attention` of each step comes in `StepView.attention` (rows, src_len)."""

    target: TargetControls
    sources: Tensor
    sentence_ends: Tensor
    vocab: PlacementVocab
    attention_layer: int | str | None = None  # the alignment layer (`placement_attention_layer`)
    usual: Tensor | None = field(init=False, default=None)  # (rows, constraints) the displaced word, -1: none
    pending: Tensor | None = field(init=False, default=None)  # (rows, constraints) this step's candidate usual word
    declined: Tensor | None = field(init=False, default=None)  # (rows, constraints) wrote its own word where offered
    ends_written: Tensor | None = field(init=False, default=None)  # (rows,) sentence-final marks written
    best: Tensor | None = field(init=False, default=None)  # (rows,) the model's own best token this step
    best_lprob: Tensor | None = field(init=False, default=None)  # (rows,) its log-probability
    end_mask: Tensor | None = field(init=False, default=None)  # (vocab,) sentence-final marks
    content_mask: Tensor | None = field(init=False, default=None)  # (vocab,) content-word starts

    def start(self, width: int) -> None:
        rows = self.sources.size(0) * width
        count = self.sources.size(1)
        device = self.sources.device
        self.usual = torch.full((rows, count), -1, dtype=torch.long, device=device)
        self.pending = torch.full((rows, count), -1, dtype=torch.long, device=device)
        self.declined = torch.zeros(rows, count, dtype=torch.bool, device=device)
        self.ends_written = torch.zeros(rows, dtype=torch.long, device=device)

    def observe(self, lprobs: Tensor, view: StepView) -> None:
        """The model's own best token per row, before any rule edits the log-probabilities."""
        self.best_lprob, self.best = lprobs.max(dim=1)

    def process(self, lprobs: Tensor, view: StepView) -> None:
        target = self.target
        state = target.state
        assert state is not None and self.usual is not None and self.best is not None
        assert self.best_lprob is not None and self.ends_written is not None
        vocab = lprobs.size(1)
        if self.end_mask is None or self.end_mask.size(0) != vocab:
            self.end_mask = _mask(self.vocab.sentence_ends, vocab, lprobs.device)
            self.content_mask = _mask(self.vocab.content_starts, vocab, lprobs.device)
        assert self.content_mask is not None
        row_sentence, constraints = target.row_sentence, target.constraints
        assert constraints is not None
        lengths = constraints.lengths.index_select(0, row_sentence)  # (rows, constraints)
        phrases = constraints.tokens.index_select(0, row_sentence)  # (rows, constraints, longest)
        first = phrases[:, :, 0].clamp(min=0)  # (rows, constraints)
        is_term = self.sources.index_select(0, row_sentence).any(dim=2) & (lengths > 0)
        started = state.partial[:, :, 1:].any(dim=2) | state.met  # (rows, constraints)

        # Rows still missing a constraint write no more sentence-final marks than allowed.
        unmet = ~state.met.all(dim=1)
        allowed = (self.sentence_ends.index_select(0, row_sentence) - 1).clamp(min=0)
        # (a row whose prefix is still forced is left alone: its token is the prefix's)
        free = target.prefix_lengths.index_select(0, row_sentence) <= view.step  # (rows,)
        no_end = unmet & free & (self.ends_written >= allowed) & (view.row_max_len > view.step)
        lprobs.masked_fill_(no_end.unsqueeze(1) & self.end_mask, NEG_INF)

        # A displaced usual word stays out of its hypothesis.
        usual = self.usual
        ban = torch.where((usual >= 0) & free.unsqueeze(1), NEG_INF, float("inf")).to(lprobs.dtype)
        lprobs.scatter_reduce_(1, usual.clamp(min=0), ban, reduce="amin")

        self.pending = torch.full_like(self.usual, -1)
        if view.attention is None:
            return
        # Which term's source word each row translates now: the attention's peak.
        peak = view.attention.argmax(dim=1)  # (rows,)
        sources = self.sources.index_select(0, row_sentence)  # (rows, constraints, src_len)
        at_term = sources.gather(2, peak.view(-1, 1, 1).expand(-1, sources.size(1), 1)).squeeze(2) & is_term

        # Start the term here: its first token at the model's best score.
        assert self.declined is not None
        starting = at_term & ~started & ~self.declined & free.unsqueeze(1)
        current = lprobs.gather(1, first)
        # (a token another rule banned stays banned: the length limit, an avoided phrase, no-repeat-ngram)
        starting &= torch.isfinite(current)
        raised = torch.maximum(current, self.best_lprob.unsqueeze(1))
        lprobs.scatter_(1, first, torch.where(starting, raised, current))
        best = self.best.unsqueeze(1).expand_as(first)
        content = self.content_mask[self.best].unsqueeze(1)  # (rows, 1)
        self.pending = torch.where(starting & content & (best != first), best, -1)

    def follow(self, rows: Tensor, tokens: Tensor) -> None:
        assert self.usual is not None and self.pending is not None and self.ends_written is not None
        assert self.end_mask is not None and self.declined is not None
        pending = self.pending.index_select(0, rows)
        usual = self.usual.index_select(0, rows)
        # (the target followed its rows already: row_sentence is the new rows')
        row_sentence, constraints = self.target.row_sentence, self.target.constraints
        assert constraints is not None
        first = constraints.tokens.index_select(0, row_sentence)[:, :, 0]
        chose_term = first == tokens.unsqueeze(1)
        self.usual = torch.where(chose_term & (pending >= 0), pending, usual)
        self.declined = self.declined.index_select(0, rows) | ((pending >= 0) & (pending == tokens.unsqueeze(1)))
        self.ends_written = self.ends_written.index_select(0, rows) + self.end_mask[tokens].long()
        self.pending = torch.full_like(self.usual, -1)


def placement_for(
    target: TargetControls,
    controls: Sequence[ControlIds],
    src_len: int,
    vocab: PlacementVocab,
    attention_layer: int | str,
) -> TermPlacement | None:
    """The placement of a batch whose constraints `target` holds, from each sentence's
    `ControlIds.term_sources` and `sentence_ends`; None when no constraint came from a term."""
    assert target.constraints is not None
    count = target.constraints.count
    mask = torch.zeros(len(controls), max(count, 1), src_len, dtype=torch.bool)
    ends = torch.zeros(len(controls), dtype=torch.long)
    for s, control in enumerate(controls):
        ends[s] = control.sentence_ends
        index = {phrase: p for p, phrase in enumerate(dict.fromkeys(control.constraints))}  # as controls_for holds them
        for phrase, positions in zip(control.constraints, control.term_sources, strict=False):
            for position in positions:
                if position < src_len:
                    mask[s, index[phrase], position] = True
    if not mask.any():
        return None
    device = target.prefix.device
    return TermPlacement(target, mask.to(device), ends.to(device), vocab, attention_layer)


def placement_attention_layer(cfg: DecodeConfig, depth: int | None) -> int | str:
    """The attention term placement reads: the alignment layer (`decode.alignment_layer`, a
    guided run's head once resolved; else the default, the last of a one-layer decoder), its
    head or the heads' average."""
    layer = int(cfg.alignment_layer) if cfg.alignment_layer is not None else DEFAULT_ALIGNMENT_LAYER
    if cfg.alignment_layer is None and depth is not None and depth < -DEFAULT_ALIGNMENT_LAYER:
        layer = -1
    return layer if cfg.alignment_head is None else f"{layer}:{int(cfg.alignment_head)}"
