"""The generator loop: encode once, then step the decoder until every sentence is done.

Greedy decoding, beam search and sampling share this loop and the same step function
(`CachedStep`: one `model.decode_step` per token with the KV cache); they differ only in
the search algorithm that turns log-probabilities into choices (`algorithms.py`,
`sampling.py`). Per step, for all live hypotheses at once:

1. logits from the step function -> log-softmax (fp32) -> the step processors, one list
   called through the same hooks (`processors.py`: pad/bos and a multilingual run's tag
   symbols banned, EOS banned before `min_len` and forced at `max_len`, no-repeat-ngram, and
   a sentence's prefix, constraints and avoided phrases, `constraints.py`);
2. the algorithm's choices; an EOS choice among the first `width` becomes a finished
   hypothesis, scored `log_prob / length**alpha` with `length` = output tokens incl. EOS;
   the first `width` non-EOS choices are the next live set (missing ones are dead: -inf);
3. finished sentences leave the batch: one `reorder(rows, sentences)` applies the beam
   back-pointers and drops them, so the batch and the compute shrink as sentences end.
   What depends only on the source (the cross-attention keys/values) is kept once per
   sentence, not per hypothesis: following the back-pointers never copies it.

When is a sentence done? At its max length (`max_len = a * src_len + b` output tokens
before EOS, `src_len` counting the source's eos), when no live hypothesis is left, or:
- `early_stopping=True` (default; fairseq's rule, HF's `early_stopping=True`): as soon as
  it has `width` finished hypotheses. Each of them was among the `width` best candidates
  of its step, but a live hypothesis might still, in principle, end up better;
- `early_stopping=False`: only once no live hypothesis can beat the `width`-th best
  finished one. Log-probs are <= 0, so a live row with score s can at best end as
  `s / L**alpha` with L its longest possible length (alpha > 0), `s / (t+2)**alpha`
  (alpha < 0) or `s` (alpha = 0): a true bound, at the price of longer searches.
The Python work per step is constant: no loop over sentences or hypotheses, and two host
synchronisations (which hypotheses finished, which sentences stay): on a GPU, everything
else is queued without waiting.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from mtrain.config import DecodeConfig, Sampling
from mtrain.decode.search.algorithms import BeamSearch, Choices, GreedySearch, SearchAlgorithm
from mtrain.decode.search.hypothesis import Hypothesis, length_normalise
from mtrain.decode.search.processors import LengthLimits, NeverEmitted, NoRepeatNgram, StepProcessor, StepView
from mtrain.decode.search.sampling import SamplingSearch
from mtrain.decode.search.step_functions import CachedStep, DecodingModel, RecomputeStep
from mtrain.model.positions import position_limit

NEG_INF = float("-inf")


class DecodeStopped(Exception):
    """`generate`'s `stop()` said yes at a step: nobody waits for this batch any more (a
    server request past its deadline), so its decode ends there with no result."""


def build_search(cfg: DecodeConfig, device: torch.device) -> SearchAlgorithm:
    """The search algorithm a DecodeConfig asks for. Its values are checked before any
    decoding, with every other rule, by mtrain.config_checks and mtrain.decoding_rules."""
    if cfg.sampling == Sampling.none:
        return GreedySearch(1) if cfg.beam == 1 else BeamSearch(cfg.beam)
    generator = torch.Generator(device=device).manual_seed(cfg.seed)
    return SamplingSearch(
        width=cfg.nbest,  # nbest independent samples per sentence
        top_k=cfg.top_k if cfg.sampling == Sampling.topk else 0,
        top_p=cfg.top_p if cfg.sampling == Sampling.topp else 1.0,
        temperature=cfg.temperature,
        generator=generator,
        epsilon=cfg.epsilon if cfg.sampling == Sampling.epsilon else 0.0,
    )


@dataclass
class _Finished:
    """Hypotheses finished at one step (all of length `step` + EOS)."""

    sentence: Tensor  # (m,) index into the input batch
    tokens: Tensor  # (m, step)
    log_prob: Tensor  # (m,)
    score: Tensor  # (m,)
    attention: Tensor | None  # (m, step + 1, [layers,] src_len)
    # With constraints: whether each holds them all (one cut at its length limit may not,
    # and ranks after those that do); None: no constraints.
    satisfied: Tensor | None = None


@torch.inference_mode()
def generate(
    model: DecodingModel,
    src_tokens: Tensor,
    src_padding_mask: Tensor,
    cfg: DecodeConfig,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    processors: Sequence[StepProcessor] = (),
    use_cache: bool = True,
    attention_layer: int | str | None = None,
    stop: Callable[[], bool] | None = None,
) -> list[list[Hypothesis]]:
    """Decode a source batch; per sentence, up to `cfg.nbest` hypotheses, best first.

    src_tokens (batch, src_len) with the eos appended; src_padding_mask True at padding.
    `use_cache=False` recomputes the whole prefix every step (reference and benchmark).
    `attention_layer` ("last", "all" or an index; cached decoder only) fills
    `Hypothesis.attention` with that layer's cross-attention averaged over heads ("LAYER:HEAD":
    one head's; word alignments, mtrain.decode.translation.alignment).
    `processors`: the step processors beyond those every decode has (pad and bos never emitted,
    the length limits, `cfg.no_repeat_ngram`), called after them in this order: a batch's
    controls, as `mtrain.decode.search.steering.batch_processors` builds them (a multilingual
    run's tags banned, a target prefix, constraints, avoided phrases, term placement). One may
    choose the search (`StepProcessor.own_search`: the constrained beam) and read a layer's
    cross-attention (`StepProcessor.attention_layer`: term placement). None: decoding as is.
    `stop`: asked before every step; True ends the decode with DecodeStopped (a server
    request past its deadline frees the decoder within one step, not after the whole search).
    """
    device = src_tokens.device
    search = _search(cfg, processors, device)
    width = search.width
    batch = src_tokens.size(0)
    if batch == 0:
        return []
    alpha = cfg.length_penalty

    src_lengths = (~src_padding_mask).sum(dim=1)  # (batch,)
    max_len = (cfg.max_len_a * src_lengths.float() + cfg.max_len_b).long()
    # (M2M100/NLLB start from </s>: bos is eos there, and emitted)
    starts = [bos_id] if bos_id != eos_id else []
    never_emitted = torch.tensor([pad_id, *starts], dtype=torch.long, device=device)
    every_decode: list[StepProcessor] = [NeverEmitted(never_emitted), LengthLimits(cfg.min_len, eos_id)]
    if cfg.no_repeat_ngram > 0:
        every_decode.append(NoRepeatNgram(cfg.no_repeat_ngram))
    processors = [*every_decode, *processors]
    for processor in processors:
        max_len = processor.limit_lengths(max_len)
        processor.start(width)
    max_positions = position_limit(model)
    if max_positions is not None:  # bos + max_len tokens must fit the position table
        max_len = max_len.clamp(max=max_positions - 1)
    max_len = max_len.clamp(min=0)

    memory = model.encode(src_tokens, src_padding_mask)  # (batch, src_len, d_model)
    # Every sentence gets `width` rows (the algorithm says which start alive); the step
    # function keeps what depends only on the source (cross-attention keys/values) per sentence.
    expand = torch.arange(batch, device=device).repeat_interleave(width)
    step_class = CachedStep if use_cache else RecomputeStep
    # A processor that reads each step's attention (term placement, at the alignment layer)
    # gets it from what the hypotheses collect when they do (one layer of "all"), else asks for it alone.
    read = _read_attention(processors)
    step_layer, read_layer = attention_layer, None
    if read is not None:
        if attention_layer is None:
            step_layer = read
        elif attention_layer == "all":
            read_layer = int(read.split(":")[0]) if isinstance(read, str) else read
    step_fn = step_class(model, src_tokens, memory, src_padding_mask, width, step_layer)

    sentence = torch.arange(batch, device=device)  # (n,) which input sentence each active one is
    row_max_len = max_len.index_select(0, expand)  # (rows,)
    prefix = torch.full((batch * width, 1), bos_id, dtype=torch.long, device=device)
    scores = search.initial_scores(batch, device)  # (n, width)
    attention_history: Tensor | None = None  # (rows, t, [layers,] src_len) once the first step ran
    num_finished = torch.zeros(batch, dtype=torch.long, device=device)
    # The `width` best normalised finished scores per sentence (for the exact stopping bound).
    best_finished = torch.full((batch, width), NEG_INF, device=device)
    finished: list[_Finished] = []
    longest = int(max_len.max())
    shortest = int(max_len.min())  # no row is at its length limit before this step

    for step in range(longest + 1):
        if stop is not None and stop():
            raise DecodeStopped(f"stopped at step {step} of at most {longest + 1}")
        n = sentence.size(0)
        logits, attention = step_fn(prefix)
        step_attention = None
        if read is not None and attention is not None:  # (rows, src_len)
            step_attention = attention[:, read_layer] if read_layer is not None else attention
        if attention_layer is None:  # (the step's attention was the processors' alone)
            attention = None
        if attention is not None:
            attention = attention.float().unsqueeze(1)  # (rows, 1, [layers,] src_len)
            if attention_history is None:
                attention_history = attention[:, :0]
        lprobs = torch.log_softmax(logits, dim=-1, dtype=torch.float32)  # (rows, vocab), upcast in the same pass
        view = StepView(step, prefix[:, 1:], row_max_len, limits_reached=step >= shortest, attention=step_attention)
        for processor in processors:
            processor.observe(lprobs, view)
        for processor in processors:
            processor.process(lprobs, view)
        choices = search.step(lprobs.view(n, width, -1), scores)
        alive = torch.isfinite(choices.scores)  # (n, k)
        is_eos = choices.tokens == eos_id
        chosen_rows = torch.arange(n, device=device).unsqueeze(1) * width + choices.beam_index  # (n, k) row in `prefix`
        normalised = length_normalise(choices.scores, step + 1, alpha)

        # An EOS choice among the first `width` is a finished hypothesis (fairseq's rule).
        among_best = torch.arange(choices.tokens.size(1), device=device) < width
        accept = is_eos & alive & among_best
        which, pos = accept.nonzero(as_tuple=True)  # a host synchronisation (1 of 2 per step)
        if which.numel():
            rows = chosen_rows[which, pos]
            finished.append(
                _Finished(
                    sentence=sentence[which],
                    tokens=prefix.index_select(0, rows)[:, 1:],
                    log_prob=choices.scores[which, pos],
                    score=normalised[which, pos],
                    attention=(
                        torch.cat([attention_history, attention], dim=1).index_select(0, rows)
                        if attention_history is not None and attention is not None  # (set together)
                        else None
                    ),
                    satisfied=_satisfied(processors, rows),
                )
            )
            num_finished.index_add_(0, sentence[which], torch.ones_like(which))
            if not cfg.early_stopping:
                new_scores = normalised.masked_fill(~accept, NEG_INF)
                merged = torch.cat([best_finished.index_select(0, sentence), new_scores], dim=1)
                best_finished[sentence] = merged.topk(width, dim=1).values

        next_rows, next_tokens, next_scores = _next_live(choices, chosen_rows, alive & ~is_eos, width)
        sentence_max_len = max_len.index_select(0, sentence)
        done = torch.isinf(next_scores).all(dim=1) | (sentence_max_len <= step)
        enough = num_finished.index_select(0, sentence) >= width
        if cfg.early_stopping:
            done |= enough
        else:
            best_live = _best_reachable(next_scores.max(dim=1).values, step, sentence_max_len, alpha)
            done |= enough & (best_live <= best_finished.index_select(0, sentence)[:, -1])
        kept = (~done).nonzero().squeeze(1)  # a host synchronisation (2 of 2 per step)
        if kept.numel() == 0:
            break
        kept_sentences = None if kept.numel() == n else kept
        if kept_sentences is not None:
            next_rows, next_tokens, next_scores = (
                t.index_select(0, kept) for t in (next_rows, next_tokens, next_scores)
            )
            sentence = sentence.index_select(0, kept)
        index = next_rows.view(-1)  # rows to keep, following the back-pointers
        if width > 1 or kept_sentences is not None:  # greedy with no sentence done: nothing moves
            step_fn.reorder(index, kept_sentences)
        prefix = torch.cat([prefix.index_select(0, index), next_tokens.view(-1, 1)], dim=1)
        if attention_history is not None and attention is not None:
            attention_history = torch.cat([attention_history, attention], dim=1).index_select(0, index)
        row_max_len = row_max_len.index_select(0, index)
        for processor in processors:
            processor.follow(index, next_tokens.view(-1))
        scores = next_scores

    return _collect(finished, batch, cfg.nbest, src_lengths)


def _search(cfg: DecodeConfig, processors: Sequence[StepProcessor], device: torch.device) -> SearchAlgorithm:
    """The search a processor must choose with (with constraints, the constrained beam:
    mtrain.decode.search.constraints), else the one `cfg` asks for."""
    for processor in processors:
        own = processor.own_search(cfg)
        if own is not None:
            return own
    return build_search(cfg, device)


def _read_attention(processors: Sequence[StepProcessor]) -> int | str | None:
    """The cross-attention the processors read (the step function gives one layer's)."""
    layers = {processor.attention_layer for processor in processors} - {None}
    if len(layers) > 1:
        raise ValueError(f"step processors read the attention of different layers: {sorted(map(str, layers))}")
    return layers.pop() if layers else None


def decoder_depth(model: DecodingModel) -> int | None:
    """The decoder layers of `model` (an ensemble: its first member's); None: not known."""
    members = getattr(model, "members", None)
    decoder = getattr(members[0] if members else model, "decoder", None)
    return len(decoder) if decoder is not None else None


def _satisfied(processors: Sequence[StepProcessor], rows: Tensor) -> Tensor | None:
    """(len(rows),) whether these finishing rows hold what every processor requires; None:
    none requires anything."""
    verdicts = [v for v in (processor.satisfied(rows) for processor in processors) if v is not None]
    if not verdicts:
        return None
    return torch.stack(verdicts).all(dim=0) if len(verdicts) > 1 else verdicts[0]


def _next_live(choices: Choices, chosen_rows: Tensor, continues: Tensor, width: int) -> tuple[Tensor, Tensor, Tensor]:
    """The first `width` choices per sentence that do not end the hypothesis.

    Returns rows (n, width) to extend, tokens (n, width) and scores (n, width); when fewer
    than `width` choices continue, the remaining slots are dead (score -inf).
    """
    k = continues.size(1)
    position = torch.arange(k, device=continues.device).expand_as(continues)
    # Continuing choices keep their rank; the others go after them.
    order = torch.where(continues, position, position + k).topk(width, dim=1, largest=False).values
    valid = order < k
    order = order % k
    rows = chosen_rows.gather(1, order)
    tokens = choices.tokens.gather(1, order)
    scores = choices.scores.gather(1, order).masked_fill(~valid, NEG_INF)
    return rows, tokens, scores


def _best_reachable(score: Tensor, step: int, max_len: Tensor, alpha: float) -> Tensor:
    """Upper bound of the final normalised score of a live row with cumulative `score`.

    After `step` the row holds step+1 tokens; it ends with length (incl. EOS) between
    step+2 and max_len+1. Further log-probs are <= 0, so the score can only fall, and the
    bound is the division that helps most.
    """
    if alpha > 0:
        return score / (max_len.float() + 1).pow(alpha)
    return length_normalise(score, step + 2, alpha)


def _collect(finished: list[_Finished], batch: int, nbest: int, src_lengths: Tensor) -> list[list[Hypothesis]]:
    """Per input sentence, its `nbest` best finished hypotheses (one pass over outputs)."""
    per_sentence: list[list[tuple[bool, Hypothesis]]] = [[] for _ in range(batch)]
    lengths = src_lengths.tolist()
    for group in finished:
        attention = group.attention.float().cpu() if group.attention is not None else None
        satisfied = group.satisfied.tolist() if group.satisfied is not None else [True] * group.score.size(0)
        for i, (s, tokens, log_prob, score) in enumerate(
            zip(
                group.sentence.tolist(),
                group.tokens.tolist(),
                group.log_prob.tolist(),
                group.score.tolist(),
                strict=True,
            )
        ):
            hyp = Hypothesis(tokens=tokens, score=score, log_prob=log_prob)
            if attention is not None:
                hyp.attention = attention[i, ..., : lengths[s]]
            per_sentence[s].append((satisfied[i], hyp))
    results = []
    for ranked in per_sentence:
        ranked.sort(key=lambda pair: (pair[0], pair[1].score), reverse=True)  # (stable: ties keep their order)
        hyps = [hyp for _, hyp in ranked]
        results.append(hyps[:nbest] or [Hypothesis(tokens=[], score=NEG_INF, log_prob=NEG_INF)])
    return results
