"""Decoding with CTranslate2 (`engine=ctranslate2`), with mtrain's decoding semantics.

`CTranslate2Model` wraps a `ctranslate2.Translator` loaded from a directory written by
`mtrain export` (`load_ctranslate2`; a run's checkpoint is converted on the fly by
`mtrain.export.engine`), and is a decoding engine (`mtrain.decode.translation.translator.Engine`): it
translates a batch of encoded sources into the same `Hypothesis` objects as the torch
engine; `translate_encoded` batches for both. This module reads the directory format
(`METADATA_FILE`) that `mtrain.export` writes, and never imports the exporter.
How each `DecodeConfig` key maps, and where CTranslate2 differs:

- beam, nbest, length_penalty: `beam_size`, `num_hypotheses`, `length_penalty`.
  CTranslate2 divides a finished hypothesis' log-prob by `len(hypothesis)**length_penalty`;
  we ask for the end token in the hypothesis (`return_end_token`) so `len` counts EOS, as
  mtrain's `length_normalise` does, and strip it afterwards. Its beam keeps the first `beam`
  of `2*beam` candidates, finishes those ending in EOS and refills the beam from the rest, and
  stops a sentence at `beam` finished hypotheses: mtrain's rule with early_stopping=true.
  At length_penalty=0 exactly, CTranslate2 switches to another rule (stop when the best
  candidate ends), so 0 is passed as `UNNORMALISED` (1e-9): mtrain's rule, scores within 1e-8.
- max length: mtrain allows `int(a * src_len + b)` output tokens (src_len with eos), per
  sentence, then forces EOS. CTranslate2 has one `max_decoding_length` per call, so sentences
  are decoded in groups of equal source length (equal limits; also no padding). At the limit
  CTranslate2 cannot force EOS: it ends the hypotheses with whatever token wins. We allow it
  limit+1 tokens and drop a final non-EOS token, so lengths never exceed mtrain's; which
  hypothesis wins *at the limit* may differ (mtrain ranks them by the EOS log-prob).
- min_len: `min_decoding_length` (EOS banned before min_len output tokens, as in mtrain).
- pad and bos are never produced (`suppress_sequences`), as in mtrain; nor are the tag symbols
  of a multilingual run (`tokenizer.tag_ids`, mtrain.decode.engines.directions). A tag is a token like
  any other: the source arrives as pieces, `<2fr>` first.
  CTranslate2 bans tokens *before* its log-softmax (the other tokens share their tiny mass),
  mtrain after; scores differ by ~1e-5 per step, which can swap near-ties.
- no_repeat_ngram: `no_repeat_ngram_size`, the same rule, but applied before the softmax:
  when a banned token was likely, the renormalised scores differ and so may the choices.
- sampling topk/topp, temperature: CTranslate2's sampler with the same settings, seeded
  with `decode.seed`; its random stream is its own, so samples differ from engine=torch.
- early_stopping=false (mtrain's exact stopping bound) has no CTranslate2 counterpart: refused.
- target prefix: `target_prefix` (a multilingual run's tag is on the source side, so the
  prefix is the output's first pieces); as with engine=torch, the output limit is at least
  the prefix's length and the score includes the prefix's log-probabilities.
- avoided phrases: `suppress_sequences` (with pad, bos and the tags), which is one list per
  call: sentences are grouped by the phrases they avoid. Positive lexical constraints have
  no CTranslate2 counterpart: refused (engine=torch has them).
- attention pictures: the last decoder layer only (the exported alignment layer), heads averaged;
  with beam > 1 one sentence per call (see `translate_batch`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from mtrain.config import DecodeConfig, Precision, Sampling
from mtrain.decode.engines.directions import RunLanguages, single_direction
from mtrain.decode.search.constraints import ControlIds
from mtrain.decode.search.hypothesis import Hypothesis
from mtrain.decoding_rules import check_constraint_search
from mtrain.errors import MtrainError
from mtrain.rundir import EXPORT_METADATA_FILE
from mtrain.tokenizer import Tokenizer

# What `mtrain export` writes next to the model: where it came from, special tokens, position limit.
METADATA_FILE = EXPORT_METADATA_FILE

# length_penalty=0 for CTranslate2: exactly 0 would select its other stopping rule (see above).
UNNORMALISED = 1e-9

# CTranslate2's compute types by name: mtrain's precisions (each knows its own, `auto` keeps the
# exported weights' type: fp32 unless exported with quantization=...) and CTranslate2's integer types.
COMPUTE_TYPES = {
    **{precision.value: precision.ct2_compute_type for precision in Precision},
    **{name: name for name in ("int8", "int8_float32", "int8_bfloat16", "int8_float16", "int16")},
}


class CTranslate2Model:
    """A CTranslate2 translator and what decoding with mtrain's semantics needs from it."""

    def __init__(
        self,
        translator: Any,  # a ctranslate2.Translator (the library has no type annotations)
        tokenizer: Tokenizer,
        max_positions: int,
        description: str = "",
        languages: RunLanguages | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        """`tokenizer`: its `tag_ids` are never produced (`RunLanguages.reserving`).
        `metadata`: the export directory's METADATA_FILE (where the weights came from)."""
        self.translator = translator
        self.metadata = metadata or {}
        self.tokenizer = tokenizer
        self.languages = languages  # what the model translates into (None: unknown, an old export)
        self.max_positions = max_positions  # read by `position_limit` (input truncation)
        self.description = description
        pieces = tokenizer.tgt_pieces(range(tokenizer.tgt_vocab_size))
        self._target_ids = {piece: i for i, piece in enumerate(pieces)}
        self._eos_piece = pieces[tokenizer.eos_id]
        self._banned = [[pieces[i]] for i in (tokenizer.pad_id, tokenizer.bos_id, *tokenizer.tag_ids)]

    def translate_batch(
        self,
        sources: Sequence[Sequence[int]],
        cfg: DecodeConfig,
        attention_layer: int | str | None = None,
        controls: Sequence[ControlIds | None] | None = None,
    ) -> list[list[Hypothesis]]:
        """Per source (ids ending in eos, none empty), up to `cfg.nbest` hypotheses, best first;
        `controls`: target prefixes and avoided phrases (constraints: MtrainError)."""
        options = self._options(cfg, attention_layer)
        given = list(controls) if controls is not None else [None] * len(sources)
        if any(c is not None and c.constraints for c in given):
            check_constraint_search("constraints", ctranslate2=True)  # (the config checks said it first)
        results: list[list[Hypothesis]] = [[] for _ in sources]
        groups: dict[tuple[int, int, tuple[tuple[int, ...], ...]], list[int]] = {}
        for i, (ids, control) in enumerate(zip(sources, given, strict=True)):
            if len(ids) > self.max_positions:
                raise MtrainError(
                    f"model.max_positions: a source of {len(ids)} tokens exceeds the model's "
                    f"{self.max_positions} positions; shorten the input"
                )
            prefix, avoid = (control.prefix, control.avoid) if control is not None else ((), ())
            # One output limit and one list of suppressed sequences per CTranslate2 call.
            max_len = max(self.max_output_length(len(ids), cfg), min(len(prefix), self.max_positions - 1))
            groups.setdefault((len(ids), max_len, avoid), []).append(i)
        # CTranslate2 (4.8.5) gives a batch's later sentences the first-step attention row of
        # another sentence in beam search (its first step runs unexpanded): one at a time then.
        per_call = 1 if options["return_attention"] and options["beam_size"] > 1 else len(sources)
        for (_, max_len, avoid), indices in groups.items():
            suppressed = self._banned + [self.tokenizer.tgt_pieces(phrase) for phrase in avoid]
            for start in range(0, len(indices), per_call):
                batch = indices[start : start + per_call]
                src_pieces = [self.tokenizer.src_pieces(sources[i]) for i in batch]
                prefixes = [
                    self.tokenizer.tgt_pieces(c.prefix) if c and c.prefix else None for c in (given[i] for i in batch)
                ]
                outputs = self.translator.translate_batch(
                    src_pieces,
                    target_prefix=prefixes if any(prefixes) else None,
                    max_decoding_length=max_len + 1,
                    min_decoding_length=min(cfg.min_len, max_len + 1),
                    suppress_sequences=suppressed,
                    **options,
                )
                prefixed = [bool(p) for p in prefixes]
                for i, hyps in zip(batch, self._hypotheses(src_pieces, outputs, max_len, cfg, prefixed), strict=True):
                    results[i] = hyps
        return results

    def max_output_length(self, src_len: int, cfg: DecodeConfig) -> int:
        """mtrain's limit (`mtrain.decode.search.generator`): a*src_len+b in float32, truncated,
        within the position table (bos + max_len tokens must fit)."""
        limit = int((torch.tensor(float(src_len)) * cfg.max_len_a + cfg.max_len_b).long())
        return max(0, min(limit, self.max_positions - 1))

    def _options(self, cfg: DecodeConfig, attention_layer: int | str | None) -> dict[str, Any]:
        if not cfg.early_stopping:
            raise MtrainError(
                "decode.early_stopping=false: CTranslate2's beam search stops once `beam` hypotheses "
                "finished (mtrain's early_stopping=true); use it, or engine=torch"
            )
        if attention_layer not in (None, "last"):
            raise MtrainError(
                f"attention_layer={attention_layer}: with engine=ctranslate2 only the last decoder "
                "layer's attention is available; use attention_layer=last or engine=torch"
            )
        options: dict[str, Any] = dict(
            # All `beam` finished hypotheses come back, so those cut at the limit can be
            # rescored and re-ranked (see `_hypotheses`); `nbest` of them are kept.
            num_hypotheses=cfg.beam if cfg.sampling == Sampling.none else cfg.nbest,
            length_penalty=cfg.length_penalty or UNNORMALISED,
            return_end_token=True,
            return_scores=True,
            return_attention=attention_layer is not None,
            no_repeat_ngram_size=cfg.no_repeat_ngram,
            max_input_length=0,  # mtrain truncates (with a warning) before decoding
            max_batch_size=0,
        )
        if cfg.sampling == Sampling.none:
            options.update(beam_size=cfg.beam)
        else:
            import ctranslate2

            ctranslate2.set_random_seed(cfg.seed)
            options.update(
                beam_size=1,
                sampling_temperature=cfg.temperature,
                sampling_topk=cfg.top_k if cfg.sampling == Sampling.topk else 0,
                sampling_topp=cfg.top_p if cfg.sampling == Sampling.topp else 1.0,
            )
        return options

    def _hypotheses(
        self,
        src_pieces: list[list[str]],
        outputs: Sequence[Any],
        max_len: int,
        cfg: DecodeConfig,
        prefixed: Sequence[bool],
    ) -> list[list[Hypothesis]]:
        """mtrain's hypotheses from CTranslate2's results, best first, `cfg.nbest` per sentence.

        A hypothesis without EOS was cut at the length limit (max_len + 1 tokens). mtrain
        would have ended its first max_len tokens with a forced EOS: it is cut to those and
        rescored with EOS (`score_batch`, the exact log-probs), then the list is re-sorted.
        A sentence decoded from a target prefix is rescored too: CTranslate2's score leaves
        the prefix out, mtrain's includes it.
        """
        alpha = cfg.length_penalty
        per_sentence: list[list[Hypothesis]] = []
        at_limit: list[tuple[int, Hypothesis]] = []
        for row, output in enumerate(outputs):
            hyps, seen = [], set()
            attention = output.attention if output.attention else [None] * len(output.hypotheses)
            for pieces, score, weights in zip(output.hypotheses, output.scores, attention, strict=True):
                ended = bool(pieces) and pieces[-1] == self._eos_piece
                tokens = [self._target_ids[piece] for piece in (pieces[:-1] if ended else pieces[:max_len])]
                if tuple(tokens) in seen:  # two cut hypotheses can share their first max_len tokens
                    continue
                seen.add(tuple(tokens))
                length = len(tokens) + 1  # with EOS, as CTranslate2 normalised (return_end_token)
                hyp = Hypothesis(tokens=tokens, score=score, log_prob=score * length**alpha)
                if weights is not None:
                    hyp.attention = torch.tensor(weights)[:length]  # (output tokens + EOS, src_len)
                hyps.append(hyp)
                if not ended or prefixed[row]:
                    at_limit.append((row, hyp))
            per_sentence.append(hyps)
        if at_limit:
            scored = self.translator.score_batch(
                [src_pieces[row] for row, _ in at_limit],
                [self.tokenizer.tgt_pieces(hyp.tokens) for _, hyp in at_limit],
                max_input_length=0,
            )
            for (_, hyp), result in zip(at_limit, scored, strict=True):
                hyp.log_prob = sum(result.log_probs)  # tokens and EOS
                hyp.score = hyp.log_prob / (len(hyp.tokens) + 1) ** alpha
        empty = Hypothesis(tokens=[], score=float("-inf"), log_prob=float("-inf"))
        return [sorted(hyps, key=lambda h: h.score, reverse=True)[: cfg.nbest] or [empty] for hyps in per_sentence]


def compute_type(precision: str) -> str:
    """CTranslate2's compute type for mtrain's `precision` (plus CTranslate2's int8/int16 types)."""
    if precision not in COMPUTE_TYPES:
        raise MtrainError(f"precision={precision!r}: with engine=ctranslate2 choose one of {'|'.join(COMPUTE_TYPES)}")
    return COMPUTE_TYPES[precision]


def import_ctranslate2() -> Any:  # the ctranslate2 module (it has no type annotations)
    """The ctranslate2 module, or an MtrainError saying how to install it."""
    try:
        import ctranslate2
    except ImportError as error:
        raise MtrainError(
            f"ctranslate2 is not installed ({error}); install it with `pip install 'mtrain[ct2]'` "
            "(or `pip install ctranslate2`)"
        ) from error
    return ctranslate2


def load_ctranslate2(
    model_dir: Path,
    device: torch.device,
    precision: str = "auto",
    num_threads: int | None = None,
    tokenizer: Tokenizer | None = None,
    ct2_compute_type: str | None = None,
) -> CTranslate2Model:
    """Load a directory written by `mtrain export` (with the tokenizer saved in it, unless given).
    `ct2_compute_type`: CTranslate2's own name, in place of `precision` (e.g. "auto", what Argos
    Translate asks for: mtrain's `precision=auto` keeps the weights' type, CTranslate2's picks
    the fastest type the CPU supports, int8 on most)."""
    ctranslate2 = import_ctranslate2()
    model_dir = Path(model_dir)
    metadata_path = model_dir / METADATA_FILE
    if not metadata_path.is_file():
        raise MtrainError(f"{model_dir}: no {METADATA_FILE}; is this a directory written by `mtrain export`?")
    metadata = json.loads(metadata_path.read_text(encoding="utf-8"))
    languages = export_languages(metadata)
    if tokenizer is None:
        tokenizer = Tokenizer.load(model_dir)
        if languages is not None:
            tokenizer = languages.reserving(tokenizer)
    try:
        translator = ctranslate2.Translator(
            str(model_dir),
            device=device.type,
            device_index=device.index or 0,
            compute_type=ct2_compute_type or compute_type(precision),
            intra_threads=num_threads or torch.get_num_threads(),
        )
    except (RuntimeError, ValueError) as error:
        raise MtrainError(f"{model_dir}: CTranslate2 cannot load this model on {device} ({error})") from error
    description = f"{model_dir} ({metadata.get('quantization', 'float32')} weights, {translator.compute_type} compute)"
    return CTranslate2Model(translator, tokenizer, int(metadata["max_positions"]), description, languages, metadata)


def export_languages(metadata: dict[str, Any]) -> RunLanguages | None:
    """What an export directory translates: its run's data config (`data`, recorded since
    multilingual runs), else its `language_pair`; None when neither is recorded."""
    if isinstance(metadata.get("data"), dict):
        return RunLanguages.of(metadata["data"])
    parts = str(metadata.get("language_pair", "")).split("-")
    if len(parts) == 2 and all(parts):
        return single_direction(parts[0], parts[1])
    return None
