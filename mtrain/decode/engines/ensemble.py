"""Several models decoding as one: at each step, the mean of their log-probabilities.

`EnsembleModel` has the interface `generate` and its step functions use (`encode`,
`start_decoding`, `decode_step`, `forward`, and a `max_positions` for `position_limit`), so
beam search, n-best and sampling, the KV cache and the batcher work on an ensemble unchanged
(as fairseq's `--path a.pt:b.pt`, OpenNMT's `-model a b`, Marian's `--models`):

- `encode` runs each member's encoder: one memory per member;
- `start_decoding` gives an `EnsembleState`: one `DecoderState` (KV cache) per member, which
  follows the beam's back-pointers and drops finished sentences together;
- `decode_step` feeds the same tokens to every member and returns the mean over members of
  `log_softmax(logits)` (fp32), over the real target vocabulary. The generator's own
  log-softmax then normalises that mean (a normalised geometric mean of the members'
  distributions). With one member the member's logits are returned as they are: the mean of
  one distribution is itself, and the output is then bit-identical to the single model's.

Members must share the tokenizer (the opener, `mtrain.export.engine`, checks that) and may
differ otherwise: size, layer counts, positions (the ensemble's position limit is its
smallest member's), output vocabulary, padded vocabulary rows. Cross-attention pictures are
the members' weights averaged, when their shapes agree (`attention_layer=last` always does;
`all` needs equal decoder depths). It is an `nn.Module` holding its members, so `TorchEngine`
decodes it as it decodes one model: bf16/fp16 casts every member's Linear weights once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import torch
from torch import Tensor, nn

from mtrain.errors import MtrainError
from mtrain.model.positions import position_limit

if TYPE_CHECKING:
    from mtrain.model import DecoderState, Seq2SeqTransformer


class EnsembleState:
    """One decoder state per member, advanced and reordered together."""

    def __init__(self, states: list[DecoderState]) -> None:
        self.states = states

    @property
    def step(self) -> int:
        return self.states[0].step

    def reorder(self, index: Tensor) -> None:
        for state in self.states:
            state.reorder(index)

    def reorder_hypotheses(self, rows: Tensor, sentences: Tensor | None) -> None:
        for state in self.states:
            state.reorder_hypotheses(rows, sentences)


class EnsembleModel(nn.Module):
    """The members' mean log-probabilities as one decodable model (eval mode)."""

    def __init__(self, members: Sequence[Seq2SeqTransformer]) -> None:
        super().__init__()
        if not members:
            raise ValueError("an ensemble needs at least one model")
        sizes = {member.tgt_vocab_size for member in members}
        if len(sizes) > 1:
            raise MtrainError(
                f"ensemble: the members' target vocabularies differ in size ({sorted(sizes)}); "
                "ensemble members must share one tokenizer"
            )
        if len({getattr(member.src_embed, "factors", None) is None for member in members}) > 1:
            raise MtrainError(
                "ensemble: some members read terms in their source (model.term_factors) and others do not; "
                "ensemble models of one kind"
            )
        self.members = nn.ModuleList(members)
        self.tgt_vocab_size = sizes.pop()
        self.pad_id = members[0].pad_id
        limits = [limit for limit in map(position_limit, members) if limit is not None]
        self.max_positions: int | None = min(limits) if limits else None
        self.eval()

    def encode(self, src_tokens: Tensor, src_padding_mask: Tensor) -> list[Tensor]:
        """One memory (batch, src_len, d_model of that member) per member."""
        return [member.encode(src_tokens, src_padding_mask) for member in self._members()]

    def start_decoding(self, memories: list[Tensor], src_padding_mask: Tensor) -> EnsembleState:
        return EnsembleState(
            [
                member.start_decoding(memory, src_padding_mask)
                for member, memory in zip(self._members(), memories, strict=True)
            ]
        )

    def decode_step(
        self,
        prev_tokens: Tensor,
        state: EnsembleState,
        need_attention: bool = False,
        attention_layer: int | str = "last",
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Scores (rows, vocab) whose log-softmax is the ensemble's next-token distribution;
        with `need_attention`, also the members' cross-attention averaged (as `decode_step`)."""
        outputs = [
            member.decode_step(
                prev_tokens, member_state, need_attention=need_attention, attention_layer=attention_layer
            )
            for member, member_state in zip(self._members(), state.states, strict=True)
        ]
        if not need_attention:
            return self._combine(cast("list[Tensor]", outputs))  # without need_attention: logits alone
        logits, attention = zip(*outputs, strict=True)
        return self._combine(list(logits)), _mean_attention(list(attention), attention_layer)

    def forward(self, src_tokens: Tensor, src_padding_mask: Tensor, tgt_input: Tensor) -> Tensor:
        """Teacher-forced scores (batch, tgt_len, vocab), combined as `decode_step` combines them:
        the recomputing decoder (`use_cache=False`) and exhaustive-search tests use it."""
        return self._combine([member(src_tokens, src_padding_mask, tgt_input) for member in self.members])

    def _members(self) -> list[Seq2SeqTransformer]:
        return cast("list[Seq2SeqTransformer]", self.members)  # (a ModuleList yields Module)

    def _combine(self, logits: list[Tensor]) -> Tensor:
        if len(logits) == 1:
            return logits[0]
        # Members may pad the vocabulary to different widths: only the real rows are averaged.
        total = sum(
            torch.log_softmax(member_logits, dim=-1, dtype=torch.float32)[..., : self.tgt_vocab_size]
            for member_logits in logits
        )
        assert isinstance(total, Tensor)  # a sum of two or more tensors
        return total / len(logits)


def _mean_attention(attention: list[Tensor], attention_layer: int | str) -> Tensor:
    if len(attention) == 1:
        return attention[0]
    shapes = {tuple(weights.shape) for weights in attention}
    if len(shapes) > 1:
        raise MtrainError(
            f"attention_layer={attention_layer}: the ensemble's members give attention of different "
            f"shapes {sorted(shapes)} (different decoder depths); use attention_layer=last"
        )
    return torch.stack([weights.float() for weights in attention]).mean(dim=0)
